"""The one registry of strategy knobs: each is declared here once, and everything else is derived.

Contract: :data:`KNOBS` lists every knob a strategy has, in the order reports print them. A
:class:`Knob` says where it lives (``home``: the strategy's layout, batching or memory plan, or
its software :class:`~perfmodel.specs.stack.Stack`; ``None`` for a job input such as the GPU
count that only derives others), its type or named choice, its default, whether a grid crosses
it by default, its command-line flag, its help text and the CSV column aliases the measurement
loader accepts. The strategy dataclasses (:mod:`perfmodel.specs.strategy`), the stack
(:mod:`perfmodel.specs.stack`), the command-line options of every command that takes a
strategy, the ``--json`` keys, the CSV columns and the documentation's option reference are all
built from these declarations, so adding a knob is one entry here plus its physics.

A knob's ``requires`` is a rule on the other knobs of the same strategy (for example
``fsdp_step_gather`` needs ZeRO-3) and ``applies`` says where its value matters at all (the TP
overlap only with tp > 1): both are functions of a mapping of knob values that work on Python
scalars (one strategy) and on numpy columns (a grid) alike.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping
from typing import Any

from perfmodel.specs.choices import (
    AttentionKernel,
    Choice,
    CpComm,
    Dtype,
    Fp8Recipe,
    MoeDispatch,
    Recompute,
    RecomputeModule,
    Schedule,
    ZeroStage,
)
from simbase.errors import AisimError, bad_value
from simbase.parse import bool_word

HOMES = ("layout", "batching", "memory", "stack")
# the help panels of the command line, in the order --help shows them
PANELS = {
    "layout": "Layout",
    "batching": "Batching",
    "memory": "Memory plan",
    "stack": "Software stack",
}
# --grad-reduce-dtype's words
GRAD_REDUCE_WORDS = {"auto": None, "fp32": True, "bf16": False, "fp16": False}

Rule = Callable[[Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class Knob:
    """One knob of a strategy, declared once.

    Attributes:
      name: the library keyword, the ``--json`` key and the canonical CSV column.
      home: the part of the strategy that stores it (``layout``, ``batching``, ``memory``,
        ``stack``), or ``None`` for a job input that only derives other knobs.
      kind: ``int``, ``float``, ``bool``, a :class:`~perfmodel.specs.choices.Choice`, the flag
        set :class:`~perfmodel.specs.choices.RecomputeModule`, or a word map (``dict``: the
        words users type -> values; ``None`` means "by the dtype").
      default: the value a strategy gets when the knob is not given (``None``: derived).
      help: one sentence for ``--help`` and the reference, with the unit.
      flag: the command-line option (default ``--name-with-dashes``).
      aliases: other spellings the CSV loader and the library accept.
      minimum: the least value of a number.
      maximum: the largest value of a number (integers stay below 2**31 in any case).
      grid: ``"all"`` when a grid tries every valid value unless told otherwise, ``"default"``
        when it keeps the default unless values are listed.
      requires: ``(rule, expected)``: the knob may differ from its default only where the rule
        holds (checked for one strategy; a grid drops the rows that break it).
      applies: where the knob's value matters (a grid keeps one value elsewhere); ``None``:
        everywhere.
      metavar: what ``--help`` shows for the value.
      tag: for a stack behaviour a strategy's label shows, ``tag(result row, short)``: the
        text to append (empty when there is nothing to say).
      flag_aliases: other options that mean this knob (spellings some commands used before).
      auto: the values ``auto`` tries, least memory-hungry last: ``auto`` means the first that
        fits in device memory (how practitioners choose recomputation or a ZeRO stage).
      auto_rule: for a knob whose ``auto`` is a rule over the other knobs, not a memory
        estimate (the virtual pipeline stages a recipe picks): what the rule does.
      derive: for a knob whose default is ``None`` (automatic), its value from the other
        knobs' codes (scalars, numpy columns or traced arrays alike): what reports show and
        what the physics uses.
      model_default: the model preset's attribute that gives the knob's value where neither
        the caller nor a software stack does (the attention kernel a model's runs used).
      traced: a stack behaviour the step function reads only through
        :func:`perfmodel.step.select.behaviour`, so one compiled program may evaluate rows that
        a preset's rules give different values of it (the others are Python branches).
    """

    name: str
    home: str | None
    kind: Any
    default: Any
    help: str
    flag: str = ""
    aliases: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    grid: str = "default"
    requires: tuple[Rule, str] | None = None
    applies: Rule | None = None
    metavar: str = ""
    tag: Callable[[Mapping[str, Any], bool], str] | None = None
    flag_aliases: tuple[str, ...] = ()
    auto: tuple = ()
    auto_rule: str = ""
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    model_default: str = ""
    traced: bool = False

    @property
    def option(self) -> str:
        """The command-line option."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def is_choice(self) -> bool:
        return isinstance(self.kind, type) and issubclass(self.kind, Choice)

    @property
    def numeric(self) -> bool:
        """Its values are numbers (an integer, a float, or a choice whose labels are digits)."""
        if self.is_choice:
            return all(label.isdigit() for label in self.kind.labels())
        return self.kind in (int, float)

    @property
    def is_switch(self) -> bool:
        """An on/off knob (a ``--x/--no-x`` flag for one strategy)."""
        return self.kind is bool

    def words(self) -> tuple[str, ...]:
        """The values a user may type, for a choice or word map (else empty)."""
        if self.is_choice:
            return self.kind.labels()
        if isinstance(self.kind, dict):
            return tuple(self.kind)
        return ()

    def parse(self, value: Any, where: str | None = None) -> Any:
        """A user's value (a Python value or the text of an option or CSV cell) as this knob's
        value: an int, float, bool, :class:`Choice` member, recompute-module code, or a word
        map's value.

        Raises:
          AisimError: naming the knob, the bad value and what is expected.
        """
        kind = self.kind
        takes_auto = bool(self.auto or self.auto_rule)
        if takes_auto and isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if kind is bool:
            out = bool_word(value) if not isinstance(value, int | float) else None
            if isinstance(value, bool):
                out = value
            elif isinstance(value, int | float) and value in (0, 1):
                out = bool(value)
            if out is None:
                raise bad_value(where, self.name, value, self.expected())
            return out
        if kind is RecomputeModule:
            return RecomputeModule.parse(value, self.name, where)
        if isinstance(kind, dict):
            key = str(value).strip().lower() if value is not None else "auto"
            if isinstance(value, bool):
                return value
            if key not in kind:
                raise bad_value(where, self.name, value, "one of " + ", ".join(kind))
            return kind[key]
        if self.is_choice:
            try:
                return kind.parse(value, self.name, where)
            except AisimError:  # the registry's words (auto where the knob takes it)
                raise bad_value(where, self.name, value, self.expected()) from None
        return self._number(value, where)

    def _number(self, value: Any, where: str | None) -> int | float:
        expected = self.expected()
        if isinstance(value, bool):
            raise bad_value(where, self.name, value, expected)
        try:
            x = float(str(value).strip()) if isinstance(value, str) else float(value)
        except (TypeError, ValueError):
            raise bad_value(where, self.name, value, expected) from None
        too_big = self.maximum is not None and x > self.maximum
        if not math.isfinite(x) or (self.minimum is not None and x < self.minimum) or too_big:
            raise bad_value(where, self.name, value, expected)
        if self.kind is int:
            if x != int(x) or abs(x) >= 2**31:
                raise bad_value(where, self.name, value, expected)
            return int(x)
        return x

    def expected(self) -> str:
        """What a valid value looks like, for error messages."""
        if self.kind is int:
            auto = " or auto" if self.auto or self.auto_rule else ""
            if self.minimum == 1:
                return "a positive integer" + auto
            return ("an integer >= 0" if self.minimum == 0 else "an integer") + auto
        if self.kind is float:
            lo = f" >= {self.minimum:g}" if self.minimum is not None else ""
            hi = f" <= {self.maximum:g}" if self.maximum is not None else ""
            return "a number" + lo + (" and" if lo and hi else "") + hi
        if self.kind is bool:
            return "on or off (yes/no, true/false, 1/0)"
        if self.kind is RecomputeModule:
            names = ", ".join(m.name.lower() for m in RecomputeModule)
            return f"module names among core_attn, {names} (per_op alone)"
        return "one of " + ", ".join(self.words() + (("auto",) if self.auto else ()))

    def code(self, value: Any) -> float:
        """A parsed value as the float a strategy leaf stores (a choice's code)."""
        if value is None:
            return math.nan
        return float(int(value)) if isinstance(value, enum.Enum) else float(value)

    def label(self, value: Any) -> Any:
        """A stored value (a leaf's code or a stack field) as reports and JSON show it."""
        if value is None:
            return None
        if self.is_choice:
            label = self.kind(int(value)).label
            return int(label) if label.isdigit() else label  # a ZeRO stage is a number
        if self.kind is RecomputeModule:
            return RecomputeModule.label_of(value)
        if self.kind is bool or isinstance(self.kind, dict):
            return bool(value)
        if self.kind is int:
            return int(value)
        return float(value)

    def text(self, value: Any) -> str:
        """A value as a user would type it (``on``/``off`` for switches, labels for choices)."""
        if self.kind is bool:
            return "on" if value else "off"
        if isinstance(self.kind, dict):
            return next((w for w, v in self.kind.items() if v == value), str(value))
        out = self.label(value)
        return f"{out:g}" if isinstance(out, float) else str(out)


def _needs_zero3(k):
    return k["zero_stage"] == ZeroStage.PARAMETERS


def _grad_reduce_fp32_auto(dtype):
    """Megatron-Core's rule: bf16 training (and fp8/fp4, whose GEMM inputs are cast from bf16
    weights) accumulates and reduces gradients in fp32 (``accumulate_allreduce_grads_in_fp32``);
    fp16 and fp32 training keep the gradient in the compute dtype. ``dtype`` is a code."""
    return (dtype == Dtype.BF16) | (dtype >= Dtype.FP8)


KNOBS: tuple[Knob, ...] = (
    # ---------------------------------------------------------------- the job and its layout
    Knob(
        "num_gpus", None, int, 8, "Total devices.", flag="--gpus",
        aliases=("world_size", "gpus", "devices"), minimum=1, metavar="GPUS",
        flag_aliases=("--num-gpus",),
    ),
    Knob(
        "gpus_per_node", "layout", int, 8,
        "Devices that share the fast scale-up tier: a node, or an NVLink domain (default: the "
        "hardware preset's).", minimum=1,
    ),
    Knob(
        "dp", "layout", int, None, "Data-parallel degree (default gpus / (tp·cp·pp)).",
        aliases=("dp_degree", "dp_size", "data_parallel"), minimum=1, grid="derived",
    ),
    Knob(
        "tp", "layout", int, 1, "Tensor-parallel degree.",
        aliases=("hp_degree", "tp_size", "tensor_parallel"), minimum=1, grid="all",
    ),
    Knob(
        "pp", "layout", int, 1, "Pipeline-parallel degree.",
        aliases=("pp_degree", "pp_size", "pipeline_parallel"), minimum=1, grid="all",
    ),
    Knob(
        "cp", "layout", int, 1,
        "Context-parallel degree: the sequence split over this many GPUs (2·cp divides the "
        "sequence length).", aliases=("context_parallel_size", "cp_size"), minimum=1,
    ),
    Knob(
        "ep", "layout", int, 1,
        "Expert-parallel degree (MoE models): routed experts split over this many of the "
        "tp·cp·dp GPUs; divides the experts.", aliases=("expert_model_parallel_size", "ep_size"),
        minimum=1, grid="all",
    ),
    Knob(
        "etp", "layout", int, 1, "Expert tensor-parallel degree: GPUs each expert's GEMMs span.",
        aliases=("expert_tensor_parallel_size",), minimum=1,
    ),
    Knob(
        "moe_imbalance", "layout", float, 1.0,
        "Routed tokens on the busiest expert GPU over the mean (a ratio, 1.0 = balanced).",
        minimum=1.0, maximum=1024.0,
    ),
    # ---------------------------------------------------------------- batching
    Knob(
        "global_batch_size", None, int, None,
        "Samples per optimiser step (default dp · micro-batch · microbatches).",
        flag="--global-batch", aliases=("global_batch", "batch_size"), minimum=1,
        flag_aliases=("--global-batch-size",),
    ),
    Knob(
        "micro_batch_size", "batching", int, 1, "Samples per microbatch per replica.",
        flag="--micro-batch", aliases=("micro_batch", "microbatch_size", "mbs"), minimum=1,
        flag_aliases=("--micro-batch-size",),
        grid="all",
    ),
    Knob(
        "num_microbatches", "batching", int, None,
        "Microbatches per replica per step (default global batch / (dp · micro-batch)).",
        minimum=1, grid="derived",
    ),
    Knob(
        "schedule", "batching", Schedule, None,
        "Pipeline schedule (default 1f1b, interleaved when --interleave > 1).", grid="all",
    ),
    Knob(
        "interleave", "batching", int, 1,
        "Model chunks per device (v) for the interleaved schedule; auto: about two layers "
        "per chunk when pp > 1, as Megatron-Bridge's recipes.",
        aliases=("pipeline_interleaving", "num_model_chunks"), minimum=1, grid="all",
        auto_rule="pp > 1: the most chunks of at least two layers each (1F1B when there is no "
        "such split or the microbatches are not a multiple of pp)",
    ),
    # ---------------------------------------------------------------- memory plan
    Knob(
        "zero_stage", "memory", ZeroStage, 0,
        "ZeRO stage: 1 shards the optimizer state, 2 the gradients too, 3 the weights (FSDP); "
        "auto: the least that fits.",
        flag="--zero", aliases=("zero",), grid="all", flag_aliases=("--zero-stage",),
        metavar="STAGE", auto=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS,
                               ZeroStage.PARAMETERS),
    ),
    Knob(
        "shard_size", "memory", int, 0,
        "ZeRO-3/FSDP shard group in GPUs (0 = all dp·cp GPUs; a divisor of dp·cp = HSDP).",
        aliases=("hsdp_shard_size",), minimum=0,
        requires=(_needs_zero3, "0 unless the ZeRO stage is 3: only ZeRO-3/FSDP shards "
                  "parameters within groups"),
    ),
    Knob(
        "recompute", "memory", Recompute, Recompute.NONE,
        "Activation recomputation: none, selective, full, or auto (the least that fits).",
        aliases=("recompute_mode", "grad_checkpoint"), grid="all",
        auto=(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL),
    ),
    Knob(
        "recompute_layers", "memory", int, 0,
        "With full recomputation: layers per pipeline stage recomputed (0 = all); auto: the "
        "fewest that fit when --recompute is auto.",
        aliases=("recompute_num_layers",), minimum=0, auto=(0,),
        requires=(lambda k: k["recompute"] == Recompute.FULL, "0 unless recompute is full"),
    ),
    Knob(
        "sequence_parallel", "memory", bool, False,
        "Megatron sequence parallelism: norms and dropouts sharded over tp.", grid="all",
        applies=lambda k: k["tp"] > 1,
    ),
    Knob("dtype", "memory", Dtype, Dtype.BF16, "Compute precision.", aliases=("precision",)),
    # ---------------------------------------------------------------- the software stack
    Knob(
        "dp_overlap", "stack", bool, True,
        "Overlap the data-parallel gradient reduction with the backward pass.",
        aliases=("overlap_grad_reduce",),
        tag=lambda r, short: "" if r["dp_overlap"] else ("no-ovl" if short else "no-overlap"),
        traced=True,
    ),
    Knob(
        "fused_attention", "stack", bool, False,
        "A fused attention kernel (FlashAttention, cuDNN): no s x s scores stored or written "
        "(default: the model preset's).", aliases=("flash_attention", "use_flash_attn"),
        model_default="fused_attention_default",
        tag=lambda r, short: "" if not r["fused_attention"] else (
            ("FA2" if r.get("attention_kernel") == "fa2" else "FA") if short
            else "fa" + (" fa2" if r.get("attention_kernel") == "fa2" else "")
        ),
    ),
    Knob(
        "attention_kernel", "stack", AttentionKernel, AttentionKernel.CUDNN,
        "Fused attention kernel: cudnn (Transformer Engine's) or fa2 (FlashAttention-2, "
        "PyTorch SDPA's flash backend).", applies=lambda k: k["fused_attention"],
    ),
    Knob(
        "eager", "stack", bool, False,
        "PyTorch eager mode (no torch.compile): norms, RoPE, SwiGLU and residual adds as separate "
        "kernels with fp32 upcasts.", tag=lambda r, short: "eager" if r["eager"] else "",
        traced=True,
    ),
    Knob(
        "logit_bytes", "stack", float, 4.0,
        "Bytes per logit the loss holds at its peak: 4 for a fused fp32 softmax cross-entropy "
        "(Megatron), 12 unfused (torchtitan), 16 for PyTorch's loss_parallel under TP.",
        minimum=0.25, maximum=64.0, traced=True,
    ),
    Knob(
        "tp_overlap", "stack", bool, False,
        "Overlap tensor-parallel communication with the GEMMs (Transformer Engine userbuffers).",
        aliases=("tp_comm_overlap",), applies=lambda k: k["tp"] > 1, traced=True,
    ),
    Knob(
        "grad_reduce_fp32", "stack", GRAD_REDUCE_WORDS, None,
        "Gradient accumulation and reduction dtype: auto (fp32 for bf16/fp8, as Megatron-Core), "
        "fp32 or bf16.", flag="--grad-reduce-dtype", aliases=("grad_reduce_dtype",),
        derive=lambda k: _grad_reduce_fp32_auto(k["dtype"]),
    ),
    Knob(
        "param_remainders", "stack", bool, False,
        "bf16: the optimizer keeps 16-bit remainders of the weights instead of fp32 master "
        "weights (Apex/NeMo distributed Adam).",
        requires=(lambda k: k["dtype"] == Dtype.BF16,
                  "off unless dtype is bf16 (remainders complete bf16 weights to fp32)"),
    ),
    Knob(
        "bf16_moments", "stack", bool, False,
        "Adam's momentum and variance kept in bf16 instead of fp32 (Megatron-Core's "
        "precision-aware optimizer with exp_avg_dtype and exp_avg_sq_dtype bf16).",
        aliases=("bf16_optimizer_states",),
    ),
    Knob(
        "fsdp_reshard", "stack", bool, True,
        "ZeRO-3/FSDP: free gathered parameters after the forward (gathered again for the "
        "backward).", flag="--reshard-after-forward", aliases=("reshard_after_forward",),
        applies=_needs_zero3, traced=True,
    ),
    Knob(
        "fsdp_step_gather", "stack", bool, False,
        "ZeRO-3/FSDP: keep parameters gathered and gradients unreduced across the step's "
        "microbatches (PyTorch pipelining).",
        requires=(_needs_zero3, "off unless zero_stage is 3 (FSDP)"), traced=True,
    ),
    Knob(
        "fsdp_fp32_params", "stack", bool, False,
        "ZeRO-3: the sharded parameters are the fp32 master weights, cast at each all-gather "
        "(PyTorch FSDP/FSDP2 mixed precision).",
        requires=(lambda k: _needs_zero3(k) & (k["param_remainders"] == 0),
                  "off unless zero_stage is 3 (FSDP) without param_remainders"),
        traced=True,
    ),
    Knob(
        "recompute_modules", "stack", RecomputeModule, 0,
        "With selective recomputation: submodules also recomputed, comma-separated "
        "(layernorm, moe_act, mlp, mla_up_proj; or torchtitan's per_op).",
        requires=(lambda k: k["recompute"] == Recompute.SELECTIVE,
                  "none unless recompute is selective (they refine selective recomputation)"),
        metavar="MODULES", traced=True,
    ),
    Knob(
        "moe_dispatch", "stack", MoeDispatch, MoeDispatch.ALLTOALL,
        "MoE token dispatcher: alltoall, allgather or flex (DeepEP).",
        aliases=("moe_token_dispatcher_type",), applies=lambda k: k["ep"] > 1,
    ),
    Knob(
        "moe_overlap", "stack", bool, False,
        "Overlap the MoE token dispatch and combine with compute.",
        aliases=("overlap_moe_expert_parallel_comm",), applies=lambda k: k["ep"] > 1,
    ),
    Knob(
        "cp_comm", "stack", CpComm, CpComm.P2P,
        "How context-parallel ranks exchange K/V: p2p (Megatron's ring), allgather, or torch "
        "(PyTorch's ring attention).", applies=lambda k: k["cp"] > 1,
    ),
    Knob(
        "fp8_recipe", "stack", Fp8Recipe, Fp8Recipe.DELAYED,
        "How FP8/FP4 GEMM inputs are scaled: delayed (per-tensor amax history, Megatron-Core's "
        "default), tensorwise (per-tensor current scaling), rowwise (torchao; collectives stay "
        "bf16), blockwise (1x128/128x128) or mxfp8 (Blackwell 32-element blocks).",
        applies=lambda k: k["dtype"] >= Dtype.FP8,
    ),
    Knob(
        "dp_bucket_size", "stack", float, 0.0,
        "Parameters per data-parallel collective (ZeRO gathers, gradient reductions): 0 = one "
        "per layer (FSDP's per-block units); DeepSpeed buckets by its reduce/prefetch sizes.",
        aliases=("reduce_bucket_size", "ddp_bucket_size"), minimum=0.0, maximum=1e12, traced=True,
    ),
)  # fmt: skip

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
ALIAS_OF: dict[str, str] = {a: k.name for k in KNOBS for a in (k.name, *k.aliases)}


def knobs_of(home: str) -> tuple[Knob, ...]:
    """The knobs a part of the strategy stores, in registry order."""
    return tuple(k for k in KNOBS if k.home == home)


LEAF_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.home in ("layout", "batching", "memory"))
STACK_KNOBS: tuple[Knob, ...] = knobs_of("stack")
# the layout's parallel degrees: a user who gives one of them describes the layout, and a degree
# left out is 1, as every framework takes it (Megatron-LM's --tensor-model-parallel-size,
# torchtitan's parallelism.* and DeepSpeed all default to 1)
PARALLEL_DEGREES = ("dp", "tp", "pp", "cp", "ep", "etp")


def model_defaults(model: Any) -> dict[str, Any]:
    """The knob values a model preset gives where no software stack is named
    (:attr:`Knob.model_default`), by knob name."""
    return {k.name: getattr(model, k.model_default) for k in KNOBS if k.model_default}


def canonical(values: Mapping[str, Any], where: str | None = None) -> dict[str, Any]:
    """A mapping of knobs under any accepted spelling, keyed by registry names.

    Raises:
      AisimError: an unknown name, or one knob given under two spellings.
    """
    out: dict[str, Any] = {}
    for key, v in values.items():
        name = ALIAS_OF.get(key)
        if name is None:
            raise bad_value(where, key, v, "a knob of the registry (perfmodel.specs.knobs)")
        if name in out:
            raise bad_value(where, key, v, f"one spelling of {name!r}, not two")
        out[name] = v
    return out
