"""Colossal-AI benchmark logs -> measurement rows in the canonical schema.

Contract: :func:`parse_log` splits one log into runs (a launcher command line starts a new run)
and reads, for each, the configuration from the command line and the result lines:

- current ``PerformanceEvaluator``: ``Throughput: X samples/sec, TFLOPS per GPU by Megatron: Y,
  TFLOPS per GPU: Z``, with ``Max CUDA memory usage: M MB`` and ``Model params: P B``;
- older evaluator: ``Throughput: X samples/sec, TFLOPS per GPU: Y``;
- the legacy ``colossalai.trainer`` hooks: ``[Epoch N / Train]: ... Throughput = X`` (or the
  progress bar's ``throughput=X sample_per_sec``), ``Train-step: ... mean = T s``, the launch line
  ``data parallel size: D, pipeline parallel size: P, tensor parallel size: T`` and
  ``Init done, global batch size = B``.

Throughput in these logs is global (all data-parallel ranks), as Colossal-AI computes it
(``num_samples * dp_world_size / duration``). The configuration follows the flags of
``examples/language/llama/benchmark.py`` (``-c/--config``, ``-p/--plugin``, ``-b/--batch_size`` per
data-parallel rank, ``-l/--max_length``, ``-g``, ``--tp``, ``--pp``, ``--zero``, ``--mbs``,
``--pp_style``, ``--n_chunks``) with that script's defaults for flags left out; overrides win over
the log. :func:`import_logs` returns the validated table (see ``calibration.measurements``).
Reading the log text into runs is ``calibration.colossal_log``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from calibration.colossal_log import (
    Run,
    has_result,
    parse_command,
    parse_results,
    read_log,
    split_runs,
)
from calibration.measurements import normalise_measurements, preset_name
from perfmodel.specs.choices import Recompute, ZeroStage
from simbase.errors import AisimError, bad_value

# benchmark.py's -c presets: Llama-2 shapes that are model presets, and shapes that are not.
_CONFIG_PRESET = {"7b": "llama2-7b", "13b": "llama2-13b", "70b": "llama2-70b"}
_CONFIG_CUSTOM = {
    "100m": dict(num_layers=4, hidden_size=1024, num_heads=32, ffn_hidden_size=2048),
    "5b": dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=11008
    ),
    "30b": dict(num_layers=60, hidden_size=6656, num_heads=52, ffn_hidden_size=17920),
    "65b": dict(num_layers=80, hidden_size=8192, num_heads=64, ffn_hidden_size=22016),
}
_LLAMA_VOCAB = 32000

OVERRIDES = (
    "plugin", "tp", "pp", "zero", "batch_size", "global_batch_size", "num_gpus", "nnodes",
    "model", "hardware", "seq_len", "dtype", "mbs", "grad_checkpoint",
)  # fmt: skip
FLOP_CONVENTION = {
    "current": "2*N*(3+ckpt) per token, divided by tp*pp (Colossal-AI PerformanceEvaluator)",
    "older": "2*N*(3+ckpt) per token, not divided by tp*pp (older Colossal-AI evaluator)",
}


def _model(config: str) -> dict[str, Any]:
    key = config.strip().lower()
    if key in _CONFIG_PRESET:
        return {"model": _CONFIG_PRESET[key]}
    if key in _CONFIG_CUSTOM:
        return {"model": "custom", "vocab_size": _LLAMA_VOCAB, **_CONFIG_CUSTOM[key]}
    m = re.search(r"llama-?(\d)-?(\d+)b", key)
    if m:
        return {"model": f"llama{m.group(1)}-{m.group(2)}b"}
    return {"model": preset_name(key.rsplit("/", 1)[-1])}


# benchmark.py's defaults, for flags that its command line leaves out
_SCRIPT_DEFAULTS = {
    "config": "7b", "plugin": "gemini", "batch_size": 2, "max_length": 4096, "tp": 1, "pp": 1,
    "zero": 0, "mbs": 1, "grad_checkpoint": False, "pp_style": "1f1b", "n_chunks": 1,
}  # fmt: skip
_RESULT_COLUMNS = ("throughput_samples_per_s", "step_time_s", "tflops_per_gpu",
                   "tflops_per_gpu_megatron", "peak_mem_mib", "num_params")  # fmt: skip


@dataclass
class _RunFacts:
    """What one run says about a setting: an override wins, then its command line, then its
    result lines, then benchmark.py's default (when the run has a current-format command)."""

    overrides: dict[str, Any]
    command: dict[str, Any]
    results: dict[str, Any]
    defaults: dict[str, Any]
    where: str

    def get(self, key: str, cmd_key: str | None = None) -> Any:
        if key in self.overrides:
            return self.overrides[key]
        cmd_key = cmd_key or key
        if cmd_key in self.command:
            return self.command[cmd_key]
        if key in self.results:
            return self.results[key]
        return self.defaults.get(cmd_key)


def _facts(run: Run, overrides: Mapping[str, Any], where: str) -> _RunFacts:
    res = parse_results(run.lines)
    if "throughput_samples_per_s" not in res:
        raise AisimError(
            f"{where}: no 'Throughput: X samples/sec' or 'sample_per_sec' result",
            source=where,
            expected="a result line",
        )
    legacy = res["log_format"] == "legacy"
    return _RunFacts(
        overrides={k: v for k, v in overrides.items() if v is not None},
        command=parse_command(run.command) if run.command else {},
        results=res,
        defaults={} if legacy or not run.command else dict(_SCRIPT_DEFAULTS),
        where=where,
    )


def _model_columns(f: _RunFacts) -> dict[str, Any]:
    config = f.get("model", "config")
    if isinstance(config, str) and config.endswith(".py"):
        config = None  # the legacy trainer's --config is a Python config file, not a model
    if config is None:
        return {}
    return _model(str(config)) if "model" not in f.overrides else {"model": f.overrides["model"]}


def _world_size(f: _RunFacts, tp: int | None, pp: int | None) -> int:
    """The number of GPUs: an override, the launcher's processes x nodes, or dp·tp·pp."""
    num_gpus = f.overrides.get("num_gpus")
    cmd = f.command
    if num_gpus is None and "nproc_per_node" in cmd:
        nnodes = f.overrides.get("nnodes", cmd.get("nnodes"))
        if nnodes is None and "hostfile" in cmd:
            raise AisimError(
                f"{f.where}: the command uses --hostfile, so the world size is not in the log",
                source=f.where,
                field="num_gpus",
                expected="the world size",
                hint="pass {num_gpus} (or {nnodes})",
            )
        num_gpus = cmd["nproc_per_node"] * (nnodes or 1)
    dp = f.results.get("dp")
    if num_gpus is None and dp is not None and tp is not None and pp is not None:
        num_gpus = dp * tp * pp
    if num_gpus is None:
        raise AisimError(
            f"{f.where}: the world size is not in the log",
            source=f.where,
            field="num_gpus",
            expected="the world size",
            hint="pass {num_gpus}",
        )
    return num_gpus


def _layout_columns(f: _RunFacts) -> dict[str, Any]:
    """num_gpus, tp, pp, dp, zero_stage and plugin (Gemini and FSDP shard everything)."""
    tp, pp = f.get("tp"), f.get("pp")
    sp = f.get("sp") or 1
    if sp > 1:
        raise bad_value(f.where, "sp", sp, "1: Colossal-AI's sequence parallelism is not modelled")
    num_gpus = _world_size(f, tp, pp)
    plugin = f.get("plugin")
    zero = f.get("zero")
    if plugin is not None and str(plugin).lower().startswith(("gemini", "fsdp")):
        zero, pp = int(ZeroStage.PARAMETERS), 1  # without pipeline stages
    dp = f.results.get("dp")
    if dp is None and tp is not None and pp is not None and num_gpus % (tp * pp) == 0:
        dp = num_gpus // (tp * pp)
    return dict(num_gpus=num_gpus, tp=tp, pp=pp, zero_stage=zero, plugin=plugin, dp=dp)


def _batch_columns(f: _RunFacts, dp: int | None, pp: int | None) -> dict[str, Any]:
    """global_batch_size, batch_size_per_dp and, with pipelining known, the microbatches."""
    per_dp = f.get("batch_size")
    gbs = f.overrides.get("global_batch_size", f.results.get("global_batch_size"))
    if gbs is None and per_dp is not None and dp is not None:
        gbs = per_dp * dp
    if gbs is None and per_dp is None and "step_time_s" not in f.results:
        raise AisimError(
            f"{f.where}: the batch size is not in the log",
            source=f.where,
            field="batch_size",
            expected="the batch size",
            hint="pass {batch_size}",
        )
    if per_dp is None and gbs is not None and dp:
        per_dp = gbs // dp
    row: dict[str, Any] = {"global_batch_size": gbs, "batch_size_per_dp": per_dp}
    if per_dp is not None and pp is not None:
        mbs = f.get("mbs") if pp > 1 else per_dp
        if mbs is not None:
            if per_dp % mbs:
                raise bad_value(
                    f.where, "mbs", mbs, f"a divisor of the batch size per rank {per_dp}"
                )
            row.update(micro_batch_size=mbs, num_microbatches=per_dp // mbs)
    return row


def _knob_columns(f: _RunFacts, plugin: Any) -> dict[str, Any]:
    """interleave, seq_len, recompute and dtype."""
    style = f.get("pp_style")
    gc = f.get("grad_checkpoint")
    dtype = f.overrides.get("dtype")
    plugin_s = str(plugin).lower() if plugin is not None else None
    if dtype is None and plugin_s:
        dtype = "fp16" if plugin_s.startswith("fsdp") else "bf16"  # as benchmark.py sets them
    return {
        "interleave": f.get("n_chunks") if style == "interleaved" else (1 if style else None),
        "seq_len": f.get("seq_len", "max_length"),
        "recompute": None if gc is None else (Recompute.FULL if gc else Recompute.NONE).label,
        "dtype": dtype,
    }


def run_row(run: Run, overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One measurement row (canonical column names) for one run.

    Raises:
      AisimError: ``source`` ``where``; a setting the log does not give names the override that
        supplies it in its ``hint`` (``{num_gpus}``, ``{batch_size}``).
    """
    f = _facts(run, overrides, where)
    row: dict[str, Any] = _model_columns(f)
    row.update(_layout_columns(f))
    row.update(_batch_columns(f, row["dp"], row["pp"]))
    row.update(_knob_columns(f, row["plugin"]))
    row["hardware"] = f.overrides.get("hardware")
    res = f.results
    for key in _RESULT_COLUMNS:
        row[key] = res.get(key)
    row["flop_convention"] = (
        FLOP_CONVENTION.get(res["log_format"]) if "tflops_per_gpu" in res else None
    )
    row["log_format"] = res["log_format"]
    row["command"] = run.command
    return row


def parse_log(
    text: str, source: str = "<log>", overrides: Mapping[str, Any] | None = None
) -> pd.DataFrame:
    """Measurement rows, unvalidated, for every run of one log that reports a result.

    Runs without a result (for example, out of memory) are skipped; they are listed in
    ``attrs['skipped']``.
    """
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise AisimError(
            f"unknown Colossal-AI override(s) {', '.join(unknown)}; known: {', '.join(OVERRIDES)}",
            field="overrides",
            value=unknown,
            expected="keys from " + ", ".join(OVERRIDES),
        )
    rows, numbers, skipped = [], [], []
    for n, run in enumerate(split_runs(text), start=1):
        where = f"{source}: run {n}"
        if not any(has_result(ln) for ln in run.lines):
            skipped.append(f"{where}: no result line (the run did not finish?)")
            continue
        rows.append(run_row(run, overrides, where))
        numbers.append(n)
    if not rows:
        raise AisimError(
            f"{source}: no Colossal-AI result line ('Throughput: X samples/sec' or"
            " 'sample_per_sec') found",
            source=source,
            expected="a Colossal-AI result line",
        )
    df = pd.DataFrame(rows)
    df.insert(0, "run", numbers)
    df.attrs["skipped"] = skipped
    return df


def import_logs(
    paths: Iterable[str | os.PathLike],
    overrides: Mapping[str, Any] | None = None,
    *,
    skip_bad_rows: bool = False,
) -> pd.DataFrame:
    """Parses Colossal-AI logs into one validated measurement table.

    Args:
      paths: log files; each may hold several runs.
      overrides: values that win over the log (keys in :data:`OVERRIDES`; ``batch_size`` is per
        data-parallel rank, as Colossal-AI's ``-b``, and ``zero`` the ZeRO stage).
      skip_bad_rows: drop runs that fail validation instead of raising.

    Returns:
      The table of :func:`calibration.measurements.normalise_measurements`, plus ``plugin``, ``batch_size_per_dp``, ``tflops_per_gpu_megatron``,
      ``peak_mem_mib``, ``num_params``, ``log_format`` and ``command``; ``source_file`` is the log
      and ``source_row`` the run number. ``attrs['skipped']`` lists runs left out.
    """
    frames, skipped = [], []
    for path in paths:
        text = read_log(path)
        raw = parse_log(text, source=str(path), overrides=overrides)
        df = normalise_measurements(
            raw.drop(columns="run"), source=str(path), skip_bad_rows=skip_bad_rows,
            rows=raw["run"].tolist(),
        )  # fmt: skip
        skipped += raw.attrs["skipped"] + df.attrs.get("skipped", [])
        frames.append(df)
    if not frames:
        raise AisimError("no log files given", field="paths", expected="at least one log file")
    out = pd.concat(frames, ignore_index=True)
    out.attrs["skipped"] = skipped
    return out
