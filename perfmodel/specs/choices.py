"""Named constants for the categorical knobs of a strategy (schedule, ZeRO, recompute, dtype).

Each is an :class:`enum.IntEnum`, so it is stored as a number in a strategy's array leaves and
compared with ``==`` inside ``jit`` (``s.schedule == Schedule.INTERLEAVED``). ``label`` is the
name users type and reports print; :func:`Choice.parse` reads a label or a number.
"""

from __future__ import annotations

import enum

from simbase.errors import bad_value


class Choice(enum.IntEnum):
    """An integer code with a user-facing label (the lower-case name unless overridden)."""

    @property
    def label(self) -> str:
        """The name users type and reports print (``"1f1b"``, ``"selective"``, ``"bf16"``)."""
        return _LABELS.get((type(self), int(self)), self.name.lower())

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        """Every label, in code order (index == code)."""
        return tuple(m.label for m in cls)

    @classmethod
    def parse(cls, value: object, field: str, where: str | None = None, aliases=None) -> Choice:
        """The member named by a label (any case, ``aliases`` first) or a code in range.

        Args:
          value: a member, a label, or an integral code (``2`` or ``2.0``).
          field: the argument or column that held it (named in the error).
          where: the error's source (``None``: an argument of the call).
          aliases: extra spellings -> labels (e.g. :data:`RECOMPUTE_ALIASES`).

        Returns:
          The member.

        Raises:
          AisimError: naming ``field``, the bad value and the labels.
        """
        if isinstance(value, cls):
            return value
        shown = value
        if isinstance(value, str):
            key = value.strip().lower()
            key = (aliases or _ALIASES.get(cls, {})).get(key, key)
            for m in cls:
                if m.label == key:
                    return m
            try:  # a code written as text ("2", "2.0": a CSV cell)
                value = float(key)
            except ValueError:
                value = None
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and float(value).is_integer()
        ):
            try:
                return cls(int(value))
            except ValueError:
                pass
        raise bad_value(where, field, shown, "one of " + ", ".join(cls.labels()))


class Schedule(Choice):
    """Pipeline schedule (Narayanan et al. SC21 §2.2)."""

    GPIPE = 0
    ONE_F_ONE_B = 1
    INTERLEAVED = 2


class ZeroStage(Choice):
    """ZeRO partitioning of model states over the data-parallel ranks (Rajbhandari et al. 2020)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3


class Recompute(Choice):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2


class Dtype(Choice):
    """Compute precision of the GEMMs. ``fp8`` and ``fp4`` run the linear layers' GEMMs in
    8 or 4 bits (scaled by the stack's :class:`Fp8Recipe`; ``fp4`` is NVFP4, or MXFP4 under the
    ``mxfp8`` recipe) and keep activations, attention and the loss in 16 bits."""

    FP32 = 0
    TF32 = 1
    BF16 = 2
    FP16 = 3
    FP8 = 4
    FP4 = 5


class Fp8Recipe(Choice):
    """How FP8 (and FP4) GEMM inputs are scaled: the stack's quantization recipe.

    ``delayed``: one scale per tensor from the amax history of earlier steps (Transformer
    Engine's ``DelayedScaling``, Megatron-Core's default); ``tensorwise``: one scale per
    tensor from its current amax (TE's ``Float8CurrentScaling``: Megatron-Bridge's FP8-CS;
    torchao's tensorwise); ``rowwise``: one scale per row, computed each time (torchao's
    default in torchtitan; collectives stay 16-bit); ``blockwise``: 1×128 blocks of
    activations and gradients, 128×128 of weights (DeepSeek-V3's recipe, TE's
    ``Float8BlockScaling``); ``mxfp8``: 32-element blocks with 8-bit exponent scales
    (Blackwell's microscaling, TE's ``MXFP8BlockScaling``)."""

    DELAYED = 0
    TENSORWISE = 1
    ROWWISE = 2
    BLOCKWISE = 3
    MXFP8 = 4


class MoeDispatch(Choice):
    """How routed tokens reach their experts (Megatron-Core's token dispatchers)."""

    ALLTOALL = 0
    ALLGATHER = 1
    FLEX = 2  # DeepEP/HybridEP: a token crosses to each remote NVLink domain once


class CpComm(Choice):
    """How context-parallel ranks exchange K/V: Megatron-Core's ``cp_comm_type`` (``p2p``
    ring, ``allgather``), or PyTorch's ring attention (``torch``: ``context_parallel`` in
    ``torch.distributed.tensor.experimental``, what torchtitan runs), which all-gathers K/V
    behind the local block and merges partial outputs and gradients in fp32 on the compute
    stream (:mod:`perfmodel.step.torch_ring`)."""

    P2P = 0
    ALLGATHER = 1
    TORCH = 2


class AttentionKernel(Choice):
    """Which fused attention kernel runs. The presets' constants describe cuDNN's fused
    attention (Transformer Engine's choice on Hopper, what Megatron-Core and NeMo run);
    FlashAttention-2 (PyTorch SDPA's flash backend, what torchtitan runs) is slower on some GPUs
    by the hardware's ``fa2_attention_ratio``."""

    CUDNN = 0
    FA2 = 1


_LABELS = {
    (Schedule, 1): "1f1b",
    (ZeroStage, 0): "0",
    (ZeroStage, 1): "1",
    (ZeroStage, 2): "2",
    (ZeroStage, 3): "3",
}

# Recompute accepts yes/no spellings (a boolean ``grad_checkpoint`` column means full).
RECOMPUTE_ALIASES = {"true": "full", "false": "none", "yes": "full", "no": "none"}
# the dtype spellings of frameworks' configs and logs (PyTorch Lightning's ``bf16-mixed``,
# Composer's ``amp_bf16``, torch's ``bfloat16``) -> labels
DTYPE_ALIASES = {
    "float32": "fp32", "float": "fp32", "f32": "fp32", "32": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16", "bf16-mixed": "bf16", "amp_bf16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16", "16": "fp16", "fp16-mixed": "fp16",
    "amp": "fp16", "amp_fp16": "fp16", "mixed": "fp16",
    "float8": "fp8", "e4m3": "fp8", "fp8_e4m3": "fp8",
    "nvfp4": "fp4", "mxfp4": "fp4", "e2m1": "fp4", "fp4_e2m1": "fp4",
}  # fmt: skip
# the recipe spellings of frameworks' configs (Megatron-Bridge's fp8_cs/fp8_mx, TE's class
# names, NeMo's "current") -> labels
FP8_RECIPE_ALIASES = {
    "current": "tensorwise", "fp8_cs": "tensorwise", "cs": "tensorwise",
    "float8currentscaling": "tensorwise", "delayedscaling": "delayed", "fp8_ds": "delayed",
    "mx": "mxfp8", "fp8_mx": "mxfp8", "mxfp8blockscaling": "mxfp8", "mxfp8_rceil": "mxfp8",
    "block": "blockwise", "subchannel": "blockwise", "float8blockscaling": "blockwise",
    "deepseek": "blockwise",
}  # fmt: skip


_ALIASES = {Recompute: RECOMPUTE_ALIASES, Dtype: DTYPE_ALIASES, Fp8Recipe: FP8_RECIPE_ALIASES}


class RecomputeModule(enum.IntFlag):
    """Submodules whose outputs selective recomputation discards and recomputes, beyond the
    attention core (Megatron-Core's ``--recompute-modules``, ``TransformerConfig.recompute_
    modules``; a strategy stores their sum, 0 = none). ``layernorm``: the input and pre-MLP
    norms; ``moe_act``: the routed experts' activation function; ``mlp``: the dense MLP
    (not an MoE layer's); ``mla_up_proj``: multi-head latent attention's up-projections.
    ``per_op`` is torchtitan's per-op selective checkpointing instead (``selective_ac_option =
    "op"``: the outputs of every other matmul and of the attention kernel are kept, the rest
    recomputed), a policy of its own that takes no other flag."""

    LAYERNORM = 1
    MOE_ACT = 2
    MLP = 4
    MLA_UP_PROJ = 8
    PER_OP = 16

    @classmethod
    def parse(cls, value: object, field: str, where: str | None = None) -> int:
        """The code of a list of module names (a sequence or a comma/space-separated string;
        ``core_attn``, which ``recompute="selective"`` already means, adds nothing) or a code.

        Raises:
          AisimError: naming ``field``, the bad value and the module names.
        """
        names = {m.name.lower(): int(m) for m in cls}
        code = -1
        if isinstance(value, int | float) and not isinstance(value, bool):
            if float(value).is_integer() and 0 <= int(value) < 2 * max(names.values()):
                code = int(value)
        elif isinstance(value, str | list | tuple):
            items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
            code = 0
            for item in items:
                key = str(item).strip().lower()
                if key == "core_attn":
                    continue
                if key not in names:
                    code = -1
                    break
                code |= names[key]
        if code >= 0 and (not code & cls.PER_OP or code == cls.PER_OP):
            return code
        expected = "module names among core_attn, " + ", ".join(names) + " (per_op alone)"
        raise bad_value(where, field, value, expected)

    @classmethod
    def label_of(cls, code: float) -> str:
        """The comma-separated names of a code (``""`` for 0), as reports print them."""
        return ",".join(m.name.lower() for m in cls if int(code) & int(m))
