"""Megatron-LM / Megatron-Core training logs -> measurement rows.

Contract: :func:`parse` reads the ``arguments`` block that ``megatron/training/arguments.py``
``_print_args`` prints at start-up (``  name ........ value``, rank 0) and the lines that
``training.py`` ``training_log`` prints (last rank) every ``log_interval`` iterations::

  [2026-...] iteration      100/    1000 | consumed samples: ... | elapsed time per iteration
  (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 401.2 | ... | global batch size:   512 | ...
  | number of skipped iterations:   0 | number of nan iterations:   0 |

Each line's time is the mean over the iterations since the previous line (the first line of a
start may cover one iteration only). Per start of the program (an ``arguments`` block, or an
iteration count that goes back), the warm-up is dropped; lines that report skipped or NaN
iterations, or a global batch size other than the configured one (batch-size ramp-up), are left
out; the same iteration printed by several ranks counts once (the first rank that printed one).
Starts with the same configuration are pooled into one row; another configuration is another
row. Besides the layout, batch, model and precision, the block gives the stack behaviours the
run used: gradient overlap, the MoE dispatcher and its overlap, the FP8 recipe, the gradient
reduction dtype and the optimizer's precision (:func:`_optimizer_precision`); a behaviour the
block does not print is left to the stack's default. A line wrapped by a terminal (no ``number
of nan iterations`` yet) is joined to the next.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calibration.logs.rows import (
    Line,
    RowBuilder,
    Sample,
    clean_lines,
    drop_warmup,
    parse_scalar,
    summarise,
)
from perfmodel.specs.knobs import ALIAS_OF
from simbase.errors import AisimError

FORMAT = "megatron"
ARGS_START = re.compile(r"-{8,} arguments -{8,}")
_ARGS_END = re.compile(r"-{8,} end of arguments -{8,}")
_ARG = re.compile(r"^\s*([A-Za-z_]\w*) (?:\.+ | )(.*)$")
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_END = re.compile(r"number of nan iterations:\s*\d+\s*\|")
_NUM = r"([-+]?(?:nan|inf|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?))"
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*" + _NUM)
_GBS = re.compile(r"global batch size:\s*(\d+)")
_SKIPPED = re.compile(r"number of skipped iterations:\s*(\d+)")
_NAN = re.compile(r"number of nan iterations:\s*(\d+)")
_PADDED = re.compile(r"padded vocab \(size: (\d+)\) with \d+ dummy tokens \(new size: (\d+)\)")
_WORLD = re.compile(
    r"using world size: (\d+), data-parallel size: (\d+),.*?tensor-model-parallel size: (\d+), "
    r"pipeline-model-parallel size: (\d+)"
)
FLOP_CONVENTION = (
    "Megatron num_floating_point_operations per GPU (GQA, SwiGLU, MoE and recompute terms)"
)

# Megatron argument -> measurement column (read as printed).
_DIRECT = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "expert_tensor_parallel_size": "etp",
    "world_size": "num_gpus",
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "seq_length": "seq_len",
    "micro_batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size",
    "num_experts": "num_experts",
    "moe_router_topk": "experts_per_token",
    "moe_ffn_hidden_size": "moe_ffn_hidden_size",
    "tp_comm_overlap": "tp_overlap",
    "sequence_parallel": "sequence_parallel",
    "swiglu": "swiglu",
    "padded_vocab_size": "vocab_size",
    "num_layers_per_virtual_pipeline_stage": "num_layers_per_virtual_pipeline_stage",
}
# Flags that turn a stack behaviour on when set (the registry knows them as the knob's aliases);
# unset, they leave the behaviour to the stack or the model preset: Megatron-Core picks
# Transformer Engine's fused attention without --use-flash-attn
_TURNS_ON = ("use_flash_attn",)
# Stack behaviours the arguments block prints under a registry alias of the knob, read as
# printed (on or off, or the named choice): they are what this run did, whatever its stack's
# recipe default (Megatron-Core prints every argument, so a present name is a fact)
_BEHAVIOURS = (
    "overlap_grad_reduce", "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type",
    "fp8_recipe",
)  # fmt: skip
# The configuration that decides whether two starts measured the same thing.
_IDENTITY = tuple(_DIRECT) + (
    "num_query_groups", "group_query_attention", "recompute_granularity", "bf16", "fp16", "fp8",
    "use_distributed_optimizer", "virtual_pipeline_model_parallel_size",
    "num_layers_per_virtual_pipeline_stage", "recompute_method", "recompute_num_layers",
    *_BEHAVIOURS, "accumulate_allreduce_grads_in_fp32", "use_precision_aware_optimizer",
    "exp_avg_dtype", "store_param_remainders",
)  # fmt: skip


@dataclass
class Start:
    """One start of the program: its arguments (value, line) and its timing lines."""

    args: dict[str, tuple[Any, int]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    tflops: dict[int, float] = field(default_factory=dict)  # line -> TFLOP/s/GPU
    gbs: dict[int, int] = field(default_factory=dict)  # line -> global batch size
    first_line: int = 0
    last_line: int = 0

    def key(self) -> tuple:
        return tuple(self.args.get(k, (None,))[0] for k in _IDENTITY)


def _join_wrapped(lines: list[Line]) -> list[Line]:
    """Joins an iteration line that a terminal wrapped (hard wrap, no indent) to its rest."""
    out: list[Line] = []
    pending: Line | None = None
    for ln in lines:
        if pending is not None:
            if ITERATION.search(ln.text) or ARGS_START.search(ln.text) or len(ln.text) == 0:
                out.append(pending)
                pending = None
            else:
                pending = Line(pending.no, pending.rank, pending.text + ln.text)
                if _END.search(pending.text):
                    out.append(pending)
                    pending = None
                continue
        if ITERATION.search(ln.text) and not _END.search(ln.text):
            pending = ln
        else:
            out.append(ln)
    if pending is not None:
        out.append(pending)
    return out


def split_starts(text: str) -> tuple[list[Start], int]:
    """Splits a log into starts of the program; also returns the duplicate rank lines dropped."""
    starts: list[Start] = [Start()]
    in_args = False
    args_rank: str | None = None  # other ranks' lines may interleave with the block
    reporting_rank: str | None = None
    duplicates = 0
    for ln in _join_wrapped(clean_lines(text)):
        t = ln.text
        if ARGS_START.search(t):
            if starts[-1].args or starts[-1].samples:
                starts.append(Start())
            starts[-1].first_line = starts[-1].first_line or ln.no
            in_args, reporting_rank, args_rank = True, None, ln.rank
            continue
        if in_args and ln.rank == args_rank:
            if _ARGS_END.search(t):
                in_args = False
            elif m := _ARG.match(t):
                starts[-1].args[m.group(1)] = (parse_scalar(m.group(2)), ln.no)
            continue
        if m := _PADDED.search(t):
            # padded_vocab_size is set after the arguments are printed (as None).
            if starts[-1].args.get("padded_vocab_size", (None,))[0] is None:
                starts[-1].args["padded_vocab_size"] = (int(m.group(2)), ln.no)
            continue
        if m := _WORLD.search(t):
            for name, g in (("world_size", 1), ("data_parallel_size", 2),
                            ("tensor_model_parallel_size", 3),
                            ("pipeline_model_parallel_size", 4)):  # fmt: skip
                starts[-1].args.setdefault(name, (int(m.group(g)), ln.no))
            continue
        it = ITERATION.search(t)
        el = _ELAPSED.search(t)
        if not it or not el:
            continue
        step = int(it.group(1))
        if reporting_rank is None:
            reporting_rank = ln.rank
        if ln.rank != reporting_rank:
            duplicates += 1
            continue
        cur = starts[-1]
        if cur.samples and step <= cur.samples[-1].step:
            # The iteration count went back without an arguments block: a restart.
            starts.append(Start(args=dict(cur.args), first_line=ln.no))
            cur = starts[-1]
        cur.samples.append(_sample(ln, step, el, cur))
        cur.first_line = cur.first_line or ln.no
        cur.last_line = ln.no
        if m := _TFLOPS.search(t):
            cur.tflops[ln.no] = float(m.group(1))
        if m := _GBS.search(t):
            cur.gbs[ln.no] = int(m.group(1))
    return [s for s in starts if s.samples or s.args], duplicates


def _sample(ln: Line, step: int, elapsed: re.Match, start: Start) -> Sample:
    interval = start.args.get("log_interval", (None,))[0]
    if start.samples:
        prev = start.samples[-1]
        after_first = prev is start.samples[0] and interval and prev.step % interval
        # training_log does not reset its timer after the first-iteration line, so the next line
        # covers that iteration again.
        steps = step - (prev.step - 1 if after_first else prev.step)
    elif interval and step % interval:
        steps = 1  # the line printed after the first iteration of a start
    else:
        steps = interval or 1
    bad = [int(m.group(1)) for r in (_SKIPPED, _NAN) if (m := r.search(ln.text))]
    value = float(elapsed.group(1)) / 1000.0
    return Sample(line=ln.no, step=step, step_time_s=value, steps=steps, ok=not any(bad))


def _group(starts: list[Start]) -> list[list[Start]]:
    groups: list[list[Start]] = []
    for s in starts:
        for g in groups:
            if g[0].key() == s.key():
                g.append(s)
                break
        else:
            groups.append([s])
    return [g for g in groups if any(s.samples for s in g)]


def _config(b: RowBuilder, args: Mapping[str, tuple[Any, int]]) -> None:
    """Measurement columns from the arguments block."""

    def arg(name: str) -> Any:
        return args.get(name, (None, 0))[0]

    def line(name: str) -> int:
        return args.get(name, (None, 0))[1]

    for name, col in _DIRECT.items():
        if arg(name) is not None:
            b.put(col, arg(name), line(name))
    if arg("group_query_attention") and arg("num_query_groups") is not None:
        b.put("num_kv_heads", arg("num_query_groups"), line("num_query_groups"))
    elif arg("num_attention_heads") is not None:
        b.put("num_kv_heads", arg("num_attention_heads"), line("num_attention_heads"))
    if "recompute_granularity" in args:
        b.put("recompute", arg("recompute_granularity") or "none", line("recompute_granularity"))
    if arg("recompute_granularity") == "full" and arg("recompute_method") == "block":
        # "block" recomputes the first recompute_num_layers layers of each stage; "uniform"
        # recomputes every layer (in groups of recompute_num_layers): the default 0 = all
        if arg("recompute_num_layers"):
            b.put("recompute_layers", arg("recompute_num_layers"), line("recompute_num_layers"))
    if "fp8" in args:
        # --fp8-format (e4m3 or hybrid) turns on Transformer Engine's FP8 GEMMs
        b.put("fp8", bool(arg("fp8")), line("fp8"))
    for name, dtype in (("fp8", "fp8"), ("bf16", "bf16"), ("fp16", "fp16")):
        if arg(name):
            b.put("dtype", dtype, line(name))
            break
    else:
        if "bf16" in args:
            b.put("dtype", "fp32", line("bf16"))
    if "use_distributed_optimizer" in args:
        # The distributed optimiser shards the optimiser states over data-parallel ranks: ZeRO-1.
        b.put("zero_stage", 1 if arg("use_distributed_optimizer") else 0,
              line("use_distributed_optimizer"))  # fmt: skip
    if "virtual_pipeline_model_parallel_size" in args:
        b.put("interleave", arg("virtual_pipeline_model_parallel_size") or 1,
              line("virtual_pipeline_model_parallel_size"))  # fmt: skip
    for flag in _TURNS_ON:
        if arg(flag):
            b.put(ALIAS_OF[flag], True, line(flag))
    for name in _BEHAVIOURS:
        if arg(name) is not None:
            b.put(ALIAS_OF[name], arg(name), line(name))
    _optimizer_precision(b, arg, line)
    if arg("num_experts") is None and "num_experts" in args:
        b.put("num_experts", 0, line("num_experts"))


def _optimizer_precision(b: RowBuilder, arg, line) -> None:
    """Gradient reduction dtype and Adam's state precision, as validate_args left them: fp32
    reduction (``accumulate_allreduce_grads_in_fp32``), and, with the precision-aware optimizer,
    2-byte moments (``exp_avg_dtype`` bf16 or fp16) and the fp32 master stored as 16-bit
    remainders of bf16 weights (``store_param_remainders`` with fp32 ``main_params_dtype``;
    megatron/core/optimizer/optimizer_config.py); without it, fp32 master and moments."""
    if arg("accumulate_allreduce_grads_in_fp32") is not None:
        fp32 = bool(arg("accumulate_allreduce_grads_in_fp32"))
        b.put("grad_reduce_fp32", "fp32" if fp32 else "bf16",
              line("accumulate_allreduce_grads_in_fp32"))  # fmt: skip
    if arg("use_precision_aware_optimizer") is None:
        return
    aware, at = bool(arg("use_precision_aware_optimizer")), line("use_precision_aware_optimizer")
    moments = str(arg("exp_avg_dtype") or "")
    b.put("bf16_moments", aware and moments.endswith("16"), line("exp_avg_dtype") or at)
    master32 = str(arg("main_params_dtype") or "float32").endswith("float32")
    remainders = aware and bool(arg("store_param_remainders")) and bool(arg("bf16")) and master32
    b.put("param_remainders", remainders, line("store_param_remainders") or at)


def _derive(b: RowBuilder) -> None:
    tp, pp, cp = b.get("tp", 1), b.get("pp", 1), b.get("cp", 1)
    n = b.require("num_gpus", "the number of GPUs (world size)")
    if b.get("dp") is None and n % (tp * pp * cp) == 0:
        # Megatron-Core's data_parallel_size = world / (tp·pp·cp)
        b.put("dp", n // (tp * pp * cp), "derived")
    if b.get("model") is None:
        b.require("num_layers", "the model shape (number of layers)", via="model")
        b.require("hidden_size", "the model shape (hidden size)", via="model")
        b.put("model", "custom", "derived")
    gbs = b.require("global_batch_size", "the global batch size")
    mbs, dp = b.get("micro_batch_size"), n // (tp * pp * cp) if n % (tp * pp * cp) == 0 else None
    if mbs and dp and gbs % (mbs * dp) == 0 and b.get("num_microbatches") is None:
        b.put("num_microbatches", gbs // (mbs * dp), "derived")
    vpp = b.get("num_layers_per_virtual_pipeline_stage")
    if b.get("interleave") is None and vpp and b.get("num_layers"):
        b.put("interleave", b.get("num_layers") // (pp * vpp), "derived")


def parse(
    text: str,
    path: str,
    overrides: Mapping[str, Any],
    skip_iterations: int | None,
) -> list[dict[str, Any]]:
    """Measurement rows for one Megatron log (see the module docstring).

    Args:
      text: the log.
      path: its name, for ``source`` and errors.
      overrides: values that win over the log (measurement column names).
      skip_iterations: warm-up iterations per start; ``None``: the first 10% of its lines.

    Raises:
      AisimError: no timing line, or a field the model needs is neither in the log nor given.
    """
    starts, duplicates = split_starts(text)
    rows = []
    for group in _group(starts):
        b = RowBuilder(FORMAT, path)
        _config(b, group[0].args)
        kept, warmup, tflops = [], 0, []
        for s in group:
            gbs = s.args.get("global_batch_size", (None,))[0]
            samples = [
                x if gbs is None or s.gbs.get(x.line, gbs) == gbs else _bad(x) for x in s.samples
            ]
            k, w = drop_warmup(samples, skip_iterations)
            kept += k
            warmup += w
            tflops += [(s.tflops[x.line], x.steps) for x in k if x.ok and x.line in s.tflops]
        if b.get("global_batch_size") is None and group[0].gbs:
            last = max(group[0].gbs)
            b.put("global_batch_size", group[0].gbs[last], last)
        timing = summarise(kept, warmup, path)
        b.timing(timing)
        if tflops:
            total = sum(w for _, w in tflops)
            b.put("tflops_per_gpu", sum(v * w for v, w in tflops) / total,
                  f"L{timing.first_line}-L{timing.last_line}")  # fmt: skip
            b.values["flop_convention"] = FLOP_CONVENTION
        b.apply(overrides)
        _derive(b)
        b.values["restarts_pooled"] = len(group)
        b.values["duplicate_rank_lines"] = duplicates
        rows.append(b.row())
    if not rows:
        raise AisimError(
            source=path,
            expected="Megatron 'iteration N/M | ... elapsed time per iteration (ms): X' lines",
        )
    return rows


def _bad(s: Sample) -> Sample:
    return Sample(line=s.line, step=s.step, step_time_s=s.step_time_s, steps=s.steps, ok=False)
