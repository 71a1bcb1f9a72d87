"""The command-line options of today's strategy knobs (context, expert and expert-tensor
parallelism, HSDP, partial recomputation, overlaps, gradient reduction dtype, MoE dispatch and
imbalance, CP exchange, FSDP resharding), shared by ``aisim perf estimate``, ``grid`` and
``sensitivity``.

:func:`estimate_knobs` turns one value of each into :func:`perfmodel.estimate`'s keyword
arguments, :func:`grid_knobs` the grid's comma lists into :func:`perfmodel.sweep`'s
restrictions. Errors name the library's parameter; :data:`FLAGS` maps it to the option.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from aisim.console import flag_names
from simbase.errors import bad_value
from simbase.parse import bool_word, parse_int_list, split_list

Multi = list[str] | None
# library parameter -> option, where the option is not --<name-with-dashes>
FLAGS = flag_names(grad_reduce_fp32="--grad-reduce-dtype", fsdp_reshard="--reshard-after-forward")
# --grad-reduce-dtype words -> grad_reduce_fp32 (None: Megatron-Core's default for the dtype)
GRAD_REDUCE = {"auto": None, "fp32": True, "bf16": False, "fp16": False}

CpOpt = Annotated[
    int,
    typer.Option(
        "--cp",
        help="Context-parallel degree: the sequence split over this many GPUs "
        "(gpus = dp·tp·pp·cp; 2·cp must divide the sequence length in tokens).",
    ),
]
EpOpt = Annotated[
    int,
    typer.Option(
        "--ep",
        help="Expert-parallel degree (MoE models): routed experts split over this many GPUs "
        "of the tp·cp·dp ranks; must divide the number of experts.",
    ),
]
EtpOpt = Annotated[
    int,
    typer.Option("--etp", help="Expert tensor-parallel degree: GPUs each expert's GEMMs span."),
]
ShardSizeOpt = Annotated[
    int,
    typer.Option(
        "--shard-size",
        help="ZeRO-3/FSDP shard group in GPUs (0 = all dp·cp GPUs; a divisor of dp·cp = HSDP).",
    ),
]
RecomputeLayersOpt = Annotated[
    int,
    typer.Option(
        "--recompute-layers",
        help="With --recompute full: layers per pipeline stage recomputed (0 = all).",
    ),
]
TpOverlapOpt = Annotated[
    bool,
    typer.Option(
        "--tp-overlap/--no-tp-overlap",
        help="Overlap tensor-parallel communication with the GEMMs (Transformer Engine).",
    ),
]
GradReduceOpt = Annotated[
    str,
    typer.Option(
        "--grad-reduce-dtype",
        help="Gradient accumulation and reduction dtype: auto (fp32 for bf16/fp8, as "
        "Megatron-Core), fp32 (4 bytes per parameter) or bf16 (2 bytes).",
    ),
]
MoeImbalanceOpt = Annotated[
    float,
    typer.Option(
        "--moe-imbalance",
        help="Routed tokens on the busiest expert GPU over the mean (a ratio, 1.0 = balanced).",
    ),
]
MoeDispatchOpt = Annotated[
    str,
    typer.Option(
        "--moe-dispatch",
        help="Token dispatcher: alltoall, allgather or flex (DeepEP: one crossing per remote "
        "NVLink domain).",
    ),
]
MoeOverlapOpt = Annotated[
    bool,
    typer.Option(
        "--moe-overlap/--no-moe-overlap",
        help="Overlap the MoE token dispatch and combine with compute.",
    ),
]
CpCommOpt = Annotated[
    str,
    typer.Option(
        "--cp-comm",
        help="How CP ranks exchange K/V: p2p (Megatron's ring), allgather, or torch "
        "(PyTorch's ring attention, as torchtitan runs: fp32 merges on the compute stream).",
    ),
]
ReshardOpt = Annotated[
    bool,
    typer.Option(
        "--reshard-after-forward/--no-reshard-after-forward",
        help="ZeRO-3/FSDP: free gathered parameters after the forward (gathered again for the "
        "backward).",
    ),
]
FsdpStepGatherOpt = Annotated[
    bool,
    typer.Option(
        "--fsdp-step-gather/--no-fsdp-step-gather",
        help="ZeRO-3/FSDP: keep parameters gathered and gradients unreduced across the step's "
        "microbatches (one all-gather and reduce-scatter per step; PyTorch pipelining).",
    ),
]
RecomputeModulesOpt = Annotated[
    str,
    typer.Option(
        "--recompute-modules",
        help="With --recompute selective: submodules also recomputed, comma-separated "
        "(Megatron-Core's layernorm, moe_act, mlp, mla_up_proj; or torchtitan's per_op).",
    ),
]
ParamRemaindersOpt = Annotated[
    bool,
    typer.Option(
        "--param-remainders/--no-param-remainders",
        help="bf16: the optimizer keeps 16-bit remainders of the weights instead of fp32 master "
        "weights (2 bytes per parameter less; Apex/NeMo distributed Adam).",
    ),
]
FsdpFp32ParamsOpt = Annotated[
    bool,
    typer.Option(
        "--fsdp-fp32-params/--no-fsdp-fp32-params",
        help="ZeRO-3: the sharded parameters are the fp32 master weights, cast to bf16 at each "
        "all-gather, with no sharded bf16 copy (PyTorch FSDP/FSDP2 mixed precision: 16 bytes "
        "per parameter, not 18).",
    ),
]
LogitBytesOpt = Annotated[
    float,
    typer.Option(
        "--logit-bytes",
        help="Bytes per logit the loss holds at its peak: 4 for a fused fp32 softmax "
        "cross-entropy (Megatron), 12 for an unfused one (torchtitan), 16 for PyTorch's "
        "loss_parallel under TP, uncompiled.",
    ),
]

EagerOpt = Annotated[
    bool,
    typer.Option(
        "--eager/--no-eager",
        help="PyTorch eager mode (no torch.compile): norms, RoPE, SwiGLU and residual adds as "
        "separate kernels with fp32 upcasts, more memory traffic than fused kernels.",
    ),
]
AttentionKernelOpt = Annotated[
    str,
    typer.Option(
        "--attention-kernel",
        help="Fused attention kernel: cudnn (Transformer Engine's, what the constants describe) "
        "or fa2 (FlashAttention-2, PyTorch SDPA's flash backend).",
    ),
]


def grad_reduce_fp32(word: str) -> bool | None:
    """``--grad-reduce-dtype``'s word as ``grad_reduce_fp32`` (``None``: the dtype's default)."""
    key = word.strip().lower()
    if key not in GRAD_REDUCE:
        raise bad_value(None, "grad_reduce_fp32", word, "one of " + ", ".join(GRAD_REDUCE))
    return GRAD_REDUCE[key]


def estimate_knobs(
    *,
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    shard_size: int = 0,
    recompute_layers: int = 0,
    tp_overlap: bool = False,
    grad_reduce_dtype: str = "auto",
    moe_imbalance: float = 1.0,
    moe_dispatch: str = "alltoall",
    moe_overlap: bool = False,
    cp_comm: str = "p2p",
    reshard_after_forward: bool = True,
    fsdp_step_gather: bool = False,
    recompute_modules: str = "",
    param_remainders: bool = False,
    logit_bytes: float = 4.0,
    eager: bool = False,
    attention_kernel: str = "cudnn",
    fsdp_fp32_params: bool = False,
) -> dict[str, Any]:
    """One value of each option as :func:`perfmodel.estimate`'s knobs (validated there)."""
    return dict(
        cp=cp,
        ep=ep,
        etp=etp,
        shard_size=shard_size,
        recompute_layers=recompute_layers,
        tp_overlap=tp_overlap,
        grad_reduce_fp32=grad_reduce_fp32(grad_reduce_dtype),
        moe_imbalance=moe_imbalance,
        moe_dispatch=moe_dispatch,
        moe_overlap=moe_overlap,
        cp_comm=cp_comm,
        fsdp_reshard=reshard_after_forward,
        fsdp_step_gather=fsdp_step_gather,
        recompute_modules=recompute_modules,
        param_remainders=param_remainders,
        logit_bytes=logit_bytes,
        eager=eager,
        attention_kernel=attention_kernel,
        fsdp_fp32_params=fsdp_fp32_params,
    )


def _ints(values: Multi, field: str, minimum: int) -> list[int] | None:
    parts = split_list(values)
    return None if parts is None else parse_int_list(",".join(parts), field, minimum=minimum)


def on_off(values: Multi, field: str) -> list[bool] | None:
    """``on``, ``off`` (any yes/no word) or ``both``, repeated or comma-separated."""
    out: list[bool] = []
    for p in split_list(values) or []:
        word = bool_word(p)
        if p.lower() == "both":
            out += [False, True]
        elif word is None:
            raise bad_value(None, field, p, "on, off or both")
        else:
            out.append(word)
    return out or None


def _floats(values: Multi, field: str) -> list[float] | None:
    out = []
    for p in split_list(values) or []:
        try:
            out.append(float(p))
        except ValueError:
            raise bad_value(None, field, p, "numbers such as 1.0,1.2") from None
    return out or None


def _grad_reduce_list(values: Multi) -> list[bool] | None:
    words = split_list(values)
    if not words:
        return None
    got = [grad_reduce_fp32(w) for w in words]
    if None in got:
        if len(words) > 1:
            raise bad_value(None, "grad_reduce_fp32", ",".join(words), "auto alone, or fp32/bf16")
        return None
    return got


def grid_knobs(
    *,
    cp: Multi = None,
    ep: Multi = None,
    etp: Multi = None,
    shard_size: Multi = None,
    recompute_layers: Multi = None,
    tp_overlap: Multi = None,
    grad_reduce_dtype: Multi = None,
    moe_imbalance: Multi = None,
    moe_dispatch: Multi = None,
    moe_overlap: Multi = None,
    cp_comm: Multi = None,
    reshard_after_forward: Multi = None,
    eager: Multi = None,
    attention_kernel: Multi = None,
) -> dict[str, list | None]:
    """The grid's comma lists as :func:`perfmodel.sweep`'s restrictions (``None``: the
    default, see :func:`perfmodel.grid.enumerate_strategies`)."""
    return dict(
        cp=_ints(cp, "cp", 1),
        ep=_ints(ep, "ep", 1),
        etp=_ints(etp, "etp", 1),
        shard_size=_ints(shard_size, "shard_size", 0),
        recompute_layers=_ints(recompute_layers, "recompute_layers", 0),
        tp_overlap=on_off(tp_overlap, "tp_overlap"),
        grad_reduce_fp32=_grad_reduce_list(grad_reduce_dtype),
        moe_imbalance=_floats(moe_imbalance, "moe_imbalance"),
        moe_dispatch=split_list(moe_dispatch),
        moe_overlap=on_off(moe_overlap, "moe_overlap"),
        cp_comm=split_list(cp_comm),
        fsdp_reshard=on_off(reshard_after_forward, "fsdp_reshard"),
        eager=on_off(eager, "eager"),
        attention_kernel=split_list(attention_kernel),
    )


# grid options: several values, comma-separated or repeated
GridCpOpt = Annotated[
    Multi,
    typer.Option("--cp", help="Context-parallel degrees to try, in GPUs, e.g. 1,2,4 (default 1)."),
]
GridEpOpt = Annotated[
    Multi,
    typer.Option(
        "--ep",
        help="Expert-parallel degrees to try, in GPUs (default: 1 for a dense model; every "
        "divisor of the experts up to 64 for a MoE model).",
    ),
]
GridEtpOpt = Annotated[
    Multi, typer.Option("--etp", help="Expert tensor-parallel degrees to try (default 1).")
]
GridShardSizeOpt = Annotated[
    Multi,
    typer.Option(
        "--shard-size",
        help="ZeRO-3 shard groups to try, in GPUs (default 0 = all dp·cp GPUs; >0 = HSDP).",
    ),
]
GridRecomputeLayersOpt = Annotated[
    Multi,
    typer.Option(
        "--recompute-layers",
        help="Layers per stage recomputed under full recomputation (default 0 = all).",
    ),
]
GridTpOverlapOpt = Annotated[
    Multi,
    typer.Option(
        "--tp-overlap", help="Overlap TP communication with GEMMs: on, off or both (default off)."
    ),
]
GridGradReduceOpt = Annotated[
    Multi,
    typer.Option(
        "--grad-reduce-dtype",
        help="Gradient reduction dtype: auto (default: fp32 for bf16/fp8), or fp32 and/or bf16.",
    ),
]
GridMoeImbalanceOpt = Annotated[
    Multi,
    typer.Option(
        "--moe-imbalance",
        help="Busiest expert GPU's routed tokens over the mean (ratios >= 1; default 1.0).",
    ),
]
GridMoeDispatchOpt = Annotated[
    Multi,
    typer.Option(
        "--moe-dispatch", help="Token dispatchers: alltoall, allgather, flex (default alltoall)."
    ),
]
GridMoeOverlapOpt = Annotated[
    Multi,
    typer.Option(
        "--moe-overlap",
        help="Overlap MoE dispatch with compute: on, off or both (default off).",
    ),
]
GridCpCommOpt = Annotated[
    Multi,
    typer.Option("--cp-comm", help="CP K/V exchange: p2p, allgather, torch (default p2p)."),
]
GridReshardOpt = Annotated[
    Multi,
    typer.Option(
        "--reshard-after-forward",
        help="ZeRO-3: free gathered parameters after the forward: on, off or both (default on).",
    ),
]
GridEagerOpt = Annotated[
    Multi,
    typer.Option(
        "--eager",
        help="PyTorch eager mode's unfused elementwise kernels: on, off or both (default off).",
    ),
]
GridAttentionKernelOpt = Annotated[
    Multi,
    typer.Option(
        "--attention-kernel", help="Fused attention kernels to try: cudnn, fa2 (default cudnn)."
    ),
]
