"""Colossal-AI ``benchmark.py`` logs of the ``args: Namespace(...)`` + ``Step time:`` generation.

Contract: the 2023 ``examples/language/llama2/benchmark.py`` (and copies of it) print the parsed
arguments as ``args: Namespace(config='13b', plugin='gemini', batch_size=8, ...)`` and, per step,
``Step time: 22.885`` (seconds) through Colossal-AI's rich logger, whose lines carry a
timestamp, get wrapped at the terminal width and share a physical line with the tqdm bar. The
``Namespace`` is the configuration (a wrapped one is joined until its parentheses close) and the
``Step time`` lines the measurement. The warm-up is the script's own ``ignore_steps`` when the
``Namespace`` has it, else the caller's ``skip_iterations``, else the first 10% of the steps.
``batch_size`` is per data-parallel rank; the world size is not printed, so it must be given.

The older generations (``Throughput: X samples/sec`` result lines with a launcher command line,
or the legacy trainer hooks) are read by :mod:`calibration.colossal`; :func:`parse` hands such a
log to :func:`calibration.colossal.parse_log` and adds the columns every importer writes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from calibration import colossal
from calibration.logs.rows import (
    Line,
    RowBuilder,
    Sample,
    clean_lines,
    default_warmup_lines,
    summarise,
)
from simbase.errors import AisimError

FORMAT = "colossal"
NAMESPACE = re.compile(r"\bargs:\s*`?Namespace\(")
STEP_TIME = re.compile(r"\bStep time:\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?|nan|inf)")
_RICH_HEAD = re.compile(r"^(?:\[\d\d/\d\d/\d\d \d\d:\d\d:\d\d\])?\s*(?:INFO|WARNING)\s+")

# colossal.py's override names for the overrides this module shares with it.
_TO_COLOSSAL = {"zero_stage": "zero", "micro_batch_size": "mbs"}


def _namespace(lines: list[Line], path: str) -> tuple[dict[str, Any], int] | None:
    """The last ``args: Namespace(...)`` as a dict, and its line; wrapped lines are joined."""
    found = None
    for i, ln in enumerate(lines):
        m = NAMESPACE.search(ln.text)
        if not m:
            continue
        text, j = ln.text[m.end() :], i
        while text.count("(") + 1 > text.count(")") and j + 1 < len(lines):
            j += 1
            text += _RICH_HEAD.sub("", lines[j].text).strip()
        inner = text[: _closing(text)]
        try:
            call = ast.parse(f"f({inner})", mode="eval").body
            values = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        except (SyntaxError, ValueError):
            raise AisimError(
                source=f"{path}:{ln.no}", field="args", value=inner[:60],
                expected="a complete 'args: Namespace(name=value, ...)' line",
            ) from None  # fmt: skip
        found = (values, ln.no)
    return found


def _closing(text: str) -> int:
    depth = 1
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i
    return len(text)


def is_namespace_log(text: str) -> bool:
    """Whether a log is of this generation (a ``Namespace`` line and ``Step time`` lines)."""
    return bool(NAMESPACE.search(text) and STEP_TIME.search(text))


def parse(
    text: str,
    path: str,
    overrides: Mapping[str, Any],
    skip_iterations: int | None,
) -> list[dict[str, Any]]:
    """Measurement rows for one Colossal-AI benchmark log, any generation.

    Args:
      text: the log.
      path: its name, for ``source`` and errors.
      overrides: values that win over the log (measurement column names).
      skip_iterations: warm-up steps; see the module docstring for the default.

    Raises:
      AisimError: no result, or a field the model needs (the world size) is not given.
    """
    if not is_namespace_log(text):
        return _older(text, path, overrides)
    lines = clean_lines(text)
    b = RowBuilder(FORMAT, path)
    ns = _namespace(lines, path)
    args, ns_line = ns if ns else ({}, 0)
    found = [(ln.no, m) for ln in lines if (m := STEP_TIME.search(ln.text))]
    samples = [Sample(no, step, float(m.group(1))) for step, (no, m) in enumerate(found, start=1)]
    if skip_iterations is None and isinstance(args.get("ignore_steps"), int):
        skip, origin = args["ignore_steps"], ns_line
    elif skip_iterations is None:
        skip, origin = default_warmup_lines(len(samples)), "default"
    else:
        skip, origin = skip_iterations, "option"
    timing = summarise(samples[skip:], min(skip, len(samples)), path)
    b.timing(timing)
    b.put("warmup_steps", skip, origin)
    results = colossal.parse_results([ln.text for ln in lines])
    markers = {"throughput_samples_per_s": "samples/sec", "tflops_per_gpu": "samples/sec",
               "peak_mem_mib": "Max CUDA memory usage", "num_params": "Model params"}  # fmt: skip
    for key, marker in markers.items():
        where = [ln.no for ln in lines if marker in ln.text]
        b.put(key, results.get(key), where[-1] if where else "log")
    if "tflops_per_gpu" in results:
        b.values["flop_convention"] = colossal.FLOP_CONVENTION.get(results.get("log_format"))

    def arg(name: str, default: Any = None) -> Any:
        return args.get(name, default)

    config = arg("config") or arg("model_type")
    if config is not None:
        # calibration.colossal maps benchmark.py's -c names (7b, 13b, ...) to model columns.
        for key, value in colossal._model(str(config)).items():
            b.put(key, value, ns_line)
    b.put("plugin", arg("plugin"), ns_line)
    for name, col in (("tp", "tp"), ("pp", "pp"), ("zero", "zero_stage"), ("mbs", "mbs"),
                      ("max_length", "seq_len"), ("batch_size", "batch_size_per_dp")):  # fmt: skip
        b.put(col, arg(name), ns_line)
    if "grad_checkpoint" in args:
        b.put("recompute", "full" if arg("grad_checkpoint") else "none", ns_line)
    b.apply(overrides)
    _derive(b, path)
    return [b.row()]


def _derive(b: RowBuilder, path: str) -> None:
    """Parallel degrees and batch sizes, as benchmark.py sets them from its arguments."""
    for col in ("tp", "pp"):
        b.setdefault(col, 1, "default")
    plugin = str(b.get("plugin") or "").lower()
    if plugin.startswith(("gemini", "fsdp")):
        # Gemini and FSDP shard everything, without pipeline stages (as calibration.colossal).
        # benchmark.py passes --zero to the 3d plugin only.
        if b.origin.get("zero_stage") != "option":
            b.put("zero_stage", 3, "derived")
        b.setdefault("dtype", "fp16" if plugin.startswith("fsdp") else "bf16", "derived")
    elif plugin:
        b.setdefault("dtype", "bf16", "derived")
    n = b.require("num_gpus", "the number of GPUs (world size)")
    tp, pp = b.get("tp"), b.get("pp")
    if n % (tp * pp):
        raise AisimError(
            source=path, field="num_gpus", value=n, expected=f"a multiple of tp*pp = {tp * pp}"
        )
    b.setdefault("dp", n // (tp * pp), "derived")
    per_dp = b.get("batch_size_per_dp")
    if b.get("global_batch_size") is None:
        b.require("batch_size_per_dp", "the batch size", via="global_batch_size")
        b.put("global_batch_size", per_dp * b.get("dp"), "derived")
    mbs = b.get("mbs")
    if pp > 1 and mbs and per_dp and per_dp % mbs == 0:
        b.put("micro_batch_size", mbs, b.origin["mbs"])
        b.put("num_microbatches", per_dp // mbs, "derived")
    elif per_dp:
        b.setdefault("micro_batch_size", per_dp, "derived")
        b.setdefault("num_microbatches", 1, "derived")
    b.values.pop("mbs", None)
    b.origin.pop("mbs", None)


def _older(text: str, path: str, overrides: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The generations :mod:`calibration.colossal` reads, with this package's extra columns."""
    ov = {_TO_COLOSSAL.get(k, k): v for k, v in overrides.items()}
    unknown = sorted(set(ov) - set(colossal.OVERRIDES))
    if unknown:
        raise AisimError(
            source=path, field="overrides", value=unknown[0],
            expected="an override this Colossal-AI generation reads: "
            + ", ".join(k for k in colossal.OVERRIDES),
        )  # fmt: skip
    df = colossal.parse_log(text, source=path, overrides=ov)
    rows = []
    for rec in df.to_dict("records"):
        run = rec.pop("run")
        origin = {k: ("option" if k in ov or k in overrides else "log") for k, v in rec.items()
                  if v is not None and k not in ("command", "log_format")}  # fmt: skip
        rec["step_time_std_s"] = None
        rec["iterations_averaged"] = None
        rec["format"] = FORMAT
        rec["source"] = f"{path}:run {run}"
        rec["provenance"] = ";".join(f"{k}={v}" for k, v in sorted(origin.items()))
        rows.append(rec)
    return rows
