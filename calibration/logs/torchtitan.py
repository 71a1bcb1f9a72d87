"""torchtitan training logs (and their TOML job configs) -> measurement rows.

Contract: :func:`parse` reads what ``torchtitan/train.py`` and ``components/metrics.py`` log
through the ``[titan] <time> - root - INFO - <message>`` logger, with ANSI colours:

- ``Building device mesh with parallelism: pp=P, dp_replicate=R, dp_shard=S, cp=C, tp=T, ...``
  (or the older ``Building N-D device mesh with ['dp_shard', 'tp'], [4, 2]``): the world size is
  the product of the degrees;
- ``Building llama3 8B with {...}`` (the model arguments as JSON over several lines) and
  ``Trainer is initialized with local batch size L, global batch size G, ..., sequence length
  S, ...``; ``Applied full activation checkpointing to the model``;
- per logged step, ``step: N  loss: X  grad_norm: ...  memory: M GiB(p%)  tps: T  tflops: F
  mfu: U%``, where ``tps`` is tokens per second per device over the steps since the previous
  logged step (``metrics.log_freq``; step 1 is logged on its own).

The step time of a line is ``global_batch_size · seq_len / (tps · num_gpus)``: torchtitan divides
each data-parallel rank's tokens by the time and by the non-data-parallel degree
(``tps = ntokens / (time · cp·tp·pp)``). The job config is read from a ``.toml`` file given with
the logs, and from ``Running with args: {...}`` (``--job.print_args``, 2024-2025 versions):
``[model]``, ``[training]``, ``[parallelism]``, ``[activation_checkpoint]``, ``[metrics]``; a
line the log prints later wins over it, and the printed dict over the file. Every rank may print
the step lines: the first rank that printed one is used. A ``Training starts at step`` line, or a
step count that goes back, starts a new stretch whose warm-up is dropped again.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from calibration.logs.rows import (
    RowBuilder,
    Sample,
    clean_lines,
    drop_warmup,
    line_range,
    summarise,
)
from calibration.measurements import preset_name
from perfmodel.specs.choices import DTYPE_ALIASES as DTYPES
from perfmodel.specs.knobs import KNOBS
from perfmodel.specs.stack_preset import load_stack
from simbase.errors import AisimError

FORMAT = "torchtitan"
STEP = re.compile(
    r"\bstep:\s*(\d+)\s+loss:\s*(\S+)\s+.*?\btps:\s*([\d,]+)(?:\s+tflops:\s*([\d,.]+))?"
    r"(?:\s+mfu:\s*([\d.]+)%)?"
)
_MEMORY = re.compile(r"\bmemory:\s*([\d.]+)\s*GiB")
_MESH = re.compile(r"Building device mesh with parallelism: (.*)")
_MESH_OLD = re.compile(r"Building \d+-D device mesh with \[([^\]]*)\], \[([^\]]*)\]")
_BUILD = re.compile(r"Building (\S+) (\S+) ?with (\{.*)")
_TRAINER = re.compile(r"local batch size (\d+), global batch size (\d+),.*?sequence length (\d+)")
_AC = re.compile(r"Applied (\w+) activation checkpointing to the model")
_FSDP_MP = "Mixed precision training is handled by fully_shard"
_PRINTED_ARGS = re.compile(r"Running with args: (\{.*\})\s*$")
_STARTS = re.compile(r"Training starts at step (\d+)")
_DEVICE = re.compile(r"(?:CUDA|GPU) capacity: (.+?) with ([\d.]+)GiB memory")
FLOP_CONVENTION = "torchtitan num_flops_per_token (6N + attention, PaLM) per device"

# Device names torchtitan prints (torch.cuda.get_device_name) -> aisim hardware presets.
_HARDWARE = (
    ("h200", "h200"), ("h100", "h100-sxm"), ("b200", "b200"), ("a100-sxm4-80gb", "a100-80gb"),
    ("a100 80gb", "a100-80gb"), ("a100-sxm4-40gb", "a100-40gb"), ("v100", "v100-32gb"),
)  # fmt: skip


def ffn_hidden_size(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan llama3 ``FeedForward``: ``int(2·4·dim/3)``, times the multiplier, rounded up."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def read_toml(path: str, text: str) -> dict[str, Any]:
    """A torchtitan job config; a TOML error names the file."""
    import tomllib  # here, not at the top: only reading a job config needs the TOML parser

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AisimError(f"{path}: not a readable TOML job config ({e})") from None


def _job_config(b: RowBuilder, cfg: Mapping[str, Any], origin: int | str) -> None:
    """Values of a job config (a TOML file, or the dict printed as ``Running with args:``).

    Read before the lines that follow it, which replace what they also print.
    """
    model, training = cfg.get("model", {}), cfg.get("training", {})
    par = cfg.get("parallelism", {}) or training  # old configs kept the degrees in [training]
    if model.get("name") and model.get("flavor"):
        b.put("model", preset_name(f"{model['name']}-{model['flavor']}"), origin)
    b.put("seq_len", training.get("seq_len"), origin)
    b.put("local_batch_size", training.get("local_batch_size", training.get("batch_size")), origin)
    gbs = training.get("global_batch_size")
    b.put("global_batch_size", gbs if gbs and gbs > 0 else None, origin)
    names = {"pp": "pipeline_parallel_degree", "tp": "tensor_parallel_degree",
             "cp": "context_parallel_degree", "dp_replicate": "data_parallel_replicate_degree",
             "dp_shard": "data_parallel_shard_degree"}  # fmt: skip
    for col, key in names.items():
        v = par.get(key)
        b.put(col, v if v is None or v > 0 else None, origin)  # -1: the rest of the world
    b.put("recompute", cfg.get("activation_checkpoint", {}).get("mode"), origin)
    mp = par.get("mixed_precision_param", training.get("mixed_precision_param"))
    b.put("dtype", DTYPES.get(str(mp).lower(), mp) if mp else None, origin)
    b.put("log_freq", cfg.get("metrics", {}).get("log_freq"), origin)


def _model_json(lines: list, i: int) -> tuple[dict[str, Any], int]:
    """The JSON object that starts on line ``i`` (it spans several lines)."""
    m = _BUILD.search(lines[i].text)
    text, j = m.group(3), i
    while True:
        try:
            return json.loads(text), lines[j].no
        except json.JSONDecodeError:
            if j + 1 >= len(lines) or j - i > 200:
                return {}, lines[i].no
            j += 1
            text += "\n" + lines[j].text


@dataclasses.dataclass
class _Steps:
    """The step lines of one rank (the first that logs one), one list of samples per stretch
    (a restart, or a step count that goes back, starts one)."""

    stretches: list[list[Sample]] = dataclasses.field(default_factory=lambda: [[]])
    begins: list[int | None] = dataclasses.field(default_factory=lambda: [None])  # when logged
    # line -> (TFLOPS, MFU, peak memory GiB) as the step line prints them
    extra: dict[int, tuple[float | None, float | None, float | None]] = dataclasses.field(
        default_factory=dict
    )
    rank: int | None = None

    def add(self, b: RowBuilder, ln, m: re.Match) -> None:
        """A ``step: N  loss: ...  tps: T`` line; a repeated step or another rank's is left out."""
        self.rank = ln.rank if self.rank is None else self.rank
        step = int(m.group(1))
        cur = self.stretches[-1]
        if ln.rank != self.rank or (cur and step == cur[-1].step):
            return
        if cur and step < cur[-1].step:
            self.stretches.append([])
            self.begins.append(None)
            cur = self.stretches[-1]
        loss = float(m.group(2))
        tps = float(m.group(3).replace(",", ""))
        if cur:
            steps = step - cur[-1].step
        elif self.begins[-1] is not None:
            steps = step - self.begins[-1] + 1
        else:
            steps = 1 if step == 1 else (b.get("log_freq") or step)
        # tps, not yet a time: converted once the batch and world size are known.
        cur.append(Sample(ln.no, step, tps, steps, ok=math.isfinite(loss) and tps > 0))
        mem = _MEMORY.search(ln.text)
        tfl = float(m.group(4).replace(",", "")) if m.group(4) else None
        mfu = float(m.group(5)) if m.group(5) else None
        self.extra[ln.no] = (tfl, mfu, float(mem.group(1)) if mem else None)

    def start(self, step: int) -> None:
        """A (re)start that says the step it begins at."""
        if self.stretches[-1]:
            self.stretches.append([])
            self.begins.append(None)
        self.begins[-1] = step


def _setting_line(b: RowBuilder, lines: list, i: int) -> None:
    """A start-up line that sets the row's fields: the printed job config, the device mesh,
    the model, the trainer's batch, activation checkpointing, FSDP's precision, the device."""
    ln = lines[i]
    t = ln.text
    if m := _PRINTED_ARGS.search(t):
        try:
            _job_config(b, ast.literal_eval(m.group(1)), ln.no)
        except (ValueError, SyntaxError):
            pass  # a cut-off or edited dict: the other start-up lines still count
    elif m := _MESH.search(t):
        for part in m.group(1).split(","):
            k, _, v = part.strip().partition("=")
            if k in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep") and v.isdigit():
                b.put(k, int(v), ln.no)
    elif m := _MESH_OLD.search(t):
        names = [x.strip().strip("'\"") for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",") if x.strip()]
        for k, v in zip(names, dims, strict=False):
            b.put(k, v, ln.no)
    elif m := _BUILD.search(t):
        args, end = _model_json(lines, i)
        b.put("model", preset_name(f"{m.group(1)}-{m.group(2)}"), ln.no)
        _model_shape(b, args, ln.no)
    elif m := _TRAINER.search(t):
        b.put("local_batch_size", int(m.group(1)), ln.no)
        b.put("global_batch_size", int(m.group(2)), ln.no)
        b.put("seq_len", int(m.group(3)), ln.no)
    elif m := _AC.search(t):
        b.put("recompute", m.group(1).lower(), ln.no)
    elif _FSDP_MP in t:
        b.put("dtype", "bf16", ln.no)  # torchtitan's default mixed_precision_param
    elif m := _DEVICE.search(t):
        name = m.group(1).lower()
        hw = next((p for key, p in _HARDWARE if key in name), None)
        b.put("hardware", hw, ln.no)


def parse(
    text: str,
    path: str,
    overrides: Mapping[str, Any],
    skip_iterations: int | None,
    toml: tuple[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One measurement row for one torchtitan log (see the module docstring).

    Args:
      text: the log.
      path: its name, for ``source`` and errors.
      overrides: values that win over the log (measurement column names).
      skip_iterations: warm-up steps per stretch; ``None``: the first 10% of its lines.
      toml: ``(path, parsed job config)`` filling what the log lacks.

    Raises:
      AisimError: no step line, or a field the model needs is neither in the log nor given.
    """
    lines = clean_lines(text)
    b = RowBuilder(FORMAT, path)
    if toml is not None:
        # The job config first: a value the log prints replaces it.
        _job_config(b, toml[1], toml[0])
    steps = _Steps()
    for i, ln in enumerate(lines):
        if m := STEP.search(ln.text):
            steps.add(b, ln, m)
        elif m := _STARTS.search(ln.text):
            steps.start(int(m.group(1)))
        else:
            _setting_line(b, lines, i)
    if not any(steps.stretches):
        raise AisimError(source=path, expected="torchtitan 'step: N  loss: ...  tps: T' lines")
    b.apply(overrides)
    _derive(b)
    return [_timing(b, steps.stretches, steps.extra, skip_iterations, path)]


def _model_shape(b: RowBuilder, args: Mapping[str, Any], no: int) -> None:
    for key, col in (("n_layers", "num_layers"), ("dim", "hidden_size"), ("n_heads", "num_heads"),
                     ("n_kv_heads", "num_kv_heads"), ("vocab_size", "vocab_size")):  # fmt: skip
        b.put(col, args.get(key), no)
    if args.get("dim") and args.get("multiple_of"):
        ffn = ffn_hidden_size(args["dim"], args["multiple_of"], args.get("ffn_dim_multiplier"))
        b.put("ffn_hidden_size", ffn, no)


@functools.cache
def _torchtitan_behaviours() -> dict[str, Any]:
    """torchtitan's behaviours for the knobs a model preset sets where no stack is named."""
    base = load_stack("torchtitan").base
    return {k.name: getattr(base, k.name) for k in KNOBS if k.model_default}


def _derive(b: RowBuilder) -> None:
    degrees = [b.get(k) for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp")]
    if b.get("num_gpus") is None and all(d is not None for d in degrees):
        b.put("num_gpus", math.prod(degrees), "derived")
    n = b.require("num_gpus", "the number of GPUs (world size)")
    for col in ("tp", "pp", "cp"):
        b.setdefault(col, 1, "default")
    # where no stack is named a model preset chooses some behaviours (the attention kernel its
    # published runs used); a torchtitan run has torchtitan's own, as its stack file records them
    # (fused attention: SDPA's flash backend or FlexAttention in every release)
    for name, value in _torchtitan_behaviours().items():
        b.setdefault(name, value, "default")
    if b.get("cp") == 1 and n % (b.get("tp") * b.get("pp")) == 0:
        b.setdefault("dp", n // (b.get("tp") * b.get("pp")), "derived")
    if b.get("dp_shard") is not None:
        b.setdefault("zero_stage", 3 if b.get("dp_shard") > 1 else 0, "derived")  # FSDP2
    b.require("model", "the model (a preset name, or its shape)")
    b.require("seq_len", "the sequence length")
    if b.get("global_batch_size") is None and b.get("local_batch_size") and b.get("dp"):
        b.put("global_batch_size", b.get("local_batch_size") * b.get("dp"), "derived")
    b.require("global_batch_size", "the global batch size")
    if b.get("local_batch_size") is not None:
        b.setdefault("micro_batch_size", b.get("local_batch_size"), "derived")


def _timing(b: RowBuilder, stretches, extra, skip_iterations, path) -> dict[str, Any]:
    tokens = b.get("global_batch_size") * b.get("seq_len")
    n = b.get("num_gpus")
    kept, warmup = [], 0
    for cur in stretches:
        times = [
            Sample(
                s.line, s.step, tokens / (s.step_time_s * n) if s.ok else math.nan, s.steps, s.ok
            )  # fmt: skip
            for s in cur
        ]
        k, w = drop_warmup(times, skip_iterations)
        kept += k
        warmup += w
    timing = summarise(kept, warmup, path)
    b.timing(timing)
    used = [s for s in kept if s.ok]
    where = line_range(timing.first_line, timing.last_line)
    for col, idx in (("tflops_per_gpu", 0), ("mfu_pct", 1), ("peak_mem_gib", 2)):
        vals = [(extra[s.line][idx], s.steps) for s in used if extra[s.line][idx] is not None]
        if vals:
            b.put(col, sum(v * w for v, w in vals) / sum(w for _, w in vals), where)
    if b.get("tflops_per_gpu") is not None:
        b.values["flop_convention"] = FLOP_CONVENTION
    return b.row()
