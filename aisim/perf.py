"""`aisim perf estimate` (one strategy) and `aisim perf grid` (every strategy, vectorised)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from aisim.common import resolve_constants
from aisim.console import console, flag_names, guard, print_json
from aisim.perf_knobs import FLAGS as KNOB_FLAGS
from aisim.perf_knobs import (
    AttentionKernelOpt,
    CpCommOpt,
    CpOpt,
    EagerOpt,
    EpOpt,
    EtpOpt,
    FsdpFp32ParamsOpt,
    FsdpStepGatherOpt,
    GradReduceOpt,
    LogitBytesOpt,
    MoeDispatchOpt,
    MoeImbalanceOpt,
    MoeOverlapOpt,
    ParamRemaindersOpt,
    RecomputeLayersOpt,
    RecomputeModulesOpt,
    ReshardOpt,
    ShardSizeOpt,
    TpOverlapOpt,
    estimate_knobs,
)
from aisim.perf_planning import (
    PLAN_FLAGS,
    PlanOptions,
    PriceOpt,
    PueOpt,
    TokensOpt,
    UtilisationOpt,
    print_plan,
)
from aisim.perf_sensitivity import SensitivityOpt, sensitivity_fields
from perfmodel import BREAKDOWN_TERMS, resolve_hardware, resolve_model
from perfmodel import estimate as estimate_strategy
from simbase import units

app = typer.Typer(no_args_is_help=True)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model preset (case-insensitive; default gpt3-175b), or 'custom' with --layers --hidden --heads --seq-len --vocab.",
    ),
]
ModelFileOpt = Annotated[
    Path | None,
    typer.Option("--model-file", help="Your own model JSON (schema of perfmodel/profiles/models)."),
]
ParamsOpt = Annotated[
    str | None,
    typer.Option(
        "--params", help="A square bias-free MLP with about this many parameters, e.g. 60M."
    ),
]
HardwareOpt = Annotated[str, typer.Option("--hardware", help="Hardware preset (case-insensitive).")]
HardwareFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--hardware-file", help="Your own hardware JSON (schema of perfmodel/profiles/hardware)."
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option("--profile", help="Calibrated profile JSON from `aisim calibrate fit --out`."),
]
CostModelOpt = Annotated[
    str,
    typer.Option(
        "--cost-model", help="aisim (default) or distir (DistIR's formulas and constants)."
    ),
]


# library parameter -> option, where the option is not --<name-with-dashes>
FLAGS = (
    flag_names(
        num_gpus="--gpus",
        micro_batch_size="--micro-batch",
        zero_stage="--zero",
        num_layers="--layers",
        hidden_size="--hidden",
        num_heads="--heads",
        vocab_size="--vocab",
    )
    | KNOB_FLAGS
)


def estimate_one(
    *,
    model: str | None = None,
    model_file: Path | None = None,
    params: str | None = None,
    widths: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    hardware: str = "a100-80gb",
    hardware_file: Path | None = None,
    gpus: int = 8,
    gpus_per_node: int | None = None,
    tp: int = 1,
    pp: int = 1,
    global_batch: int | None = None,
    micro_batch: int = 1,
    schedule: str | None = None,
    interleave: int = 1,
    recompute: str = "none",
    sequence_parallel: bool = False,
    zero: int = 0,
    dtype: str = "bf16",
    dp_overlap: bool = True,
    fused_attention: bool | None = None,
    profile: Path | None = None,
    cost_model: str = "aisim",
    plan: PlanOptions | None = None,
    sensitivity: bool = False,
    knobs: dict | None = None,
) -> dict:
    """The ``aisim perf estimate --json`` document of one strategy, from the command's options
    (the library call is :func:`perfmodel.estimate`; errors name its parameters, which
    :data:`FLAGS` maps to these options; ``sensitivity`` adds the block of
    :func:`aisim.perf_sensitivity.sensitivity_fields`; ``knobs``: today's knobs,
    :func:`aisim.perf_knobs.estimate_knobs`)."""
    m = resolve_model(
        model,
        model_file=model_file,
        params=params,
        widths=widths,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        seq_len=seq_len,
        vocab_size=vocab,
    )
    hw = resolve_hardware(hardware, hardware_file)
    consts = resolve_constants(hw, profile)
    result = estimate_strategy(
        m,
        hw,
        constants=consts,
        cost_model=cost_model,
        gpus_per_node=gpus_per_node,
        num_gpus=gpus,
        tp=tp,
        pp=pp,
        global_batch=global_batch,
        micro_batch_size=micro_batch,
        schedule=schedule,
        interleave=interleave,
        zero_stage=zero,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        dtype=dtype,
        dp_overlap=dp_overlap,
        # None: the model preset's kernel (perfmodel.estimate)
        **({} if fused_attention is None else {"fused_attention": fused_attention}),
        **(knobs or {}),
    )
    doc = result.to_dict()
    if plan is not None:
        plan.annotate(doc, result)
    if sensitivity:
        doc.update(sensitivity_fields(result, consts))
    return doc


@app.command("estimate")
def estimate(
    model: ModelOpt = None,
    model_file: ModelFileOpt = None,
    params: ParamsOpt = None,
    widths: Annotated[
        str | None,
        typer.Option("--widths", help="A generic MLP by its layer widths, e.g. 784,200,200,10."),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(help="Transformer layers (overrides the preset).")
    ] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", help="Sequence length in tokens.")
    ] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary size.")] = None,
    hardware: HardwareOpt = "a100-80gb",
    hardware_file: HardwareFileOpt = None,
    gpus: Annotated[int, typer.Option(help="Total devices.")] = 1024,
    gpus_per_node: Annotated[
        int | None,
        typer.Option("--gpus-per-node", help="Devices per node (default: the preset's)."),
    ] = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 8,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel degree (dp = gpus / (tp·pp)).")] = 8,
    global_batch: Annotated[
        int | None,
        typer.Option("--global-batch", help="Samples per optimiser step (default dp·micro-batch)."),
    ] = 1536,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Samples per microbatch.")] = 1,
    schedule: Annotated[
        str | None,
        typer.Option(
            help="gpipe, 1f1b or interleaved (default 1f1b, interleaved if --interleave > 1)."
        ),
    ] = None,
    interleave: Annotated[
        int, typer.Option(help="Model chunks per device (v) for the interleaved schedule.")
    ] = 1,
    recompute: Annotated[
        str, typer.Option(help="Activation recomputation: none, selective or full.")
    ] = "full",
    sequence_parallel: Annotated[
        bool,
        typer.Option(
            "--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism."
        ),
    ] = False,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3.")] = 0,
    dtype: Annotated[str, typer.Option(help="fp32, tf32, bf16, fp16 or fp8.")] = "bf16",
    dp_overlap: Annotated[
        bool,
        typer.Option(
            "--dp-overlap/--no-dp-overlap",
            help="Overlap the DP gradient reduction with the backward pass.",
        ),
    ] = True,
    fused_attention: Annotated[
        bool | None,
        typer.Option(
            "--fused-attention/--no-fused-attention",
            help="A fused attention kernel (FlashAttention): no s x s scores stored or written "
            "(default: the model preset's, on for Llama, Mixtral, Qwen3, DeepSeek-V3 and GPT-OSS, "
            "off for GPT-2/GPT-3).",
            show_default=False,
        ),
    ] = None,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    etp: EtpOpt = 1,
    shard_size: ShardSizeOpt = 0,
    recompute_layers: RecomputeLayersOpt = 0,
    tp_overlap: TpOverlapOpt = False,
    grad_reduce_dtype: GradReduceOpt = "auto",
    moe_imbalance: MoeImbalanceOpt = 1.0,
    moe_dispatch: MoeDispatchOpt = "alltoall",
    moe_overlap: MoeOverlapOpt = False,
    cp_comm: CpCommOpt = "p2p",
    reshard_after_forward: ReshardOpt = True,
    fsdp_step_gather: FsdpStepGatherOpt = False,
    recompute_modules: RecomputeModulesOpt = "",
    param_remainders: ParamRemaindersOpt = False,
    fsdp_fp32_params: FsdpFp32ParamsOpt = False,
    logit_bytes: LogitBytesOpt = 4.0,
    eager: EagerOpt = False,
    attention_kernel: AttentionKernelOpt = "cudnn",
    profile: ProfileOpt = None,
    cost_model: CostModelOpt = "aisim",
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    sensitivity: SensitivityOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Step-time breakdown, throughput, MFU and memory of one strategy."""
    with guard(FLAGS | PLAN_FLAGS):
        planned = PlanOptions(tokens, price_per_gpu_hour, utilisation, pue, profile)
        if planned.price_per_gpu_hour_usd is not None:
            hardware = planned.hardware(hardware, hardware_file)
            hardware_file = None
        doc = estimate_one(
            model=model,
            model_file=model_file,
            params=params,
            widths=widths,
            layers=layers,
            hidden=hidden,
            heads=heads,
            seq_len=seq_len,
            vocab=vocab,
            hardware=hardware,
            hardware_file=hardware_file,
            gpus=gpus,
            gpus_per_node=gpus_per_node,
            tp=tp,
            pp=pp,
            global_batch=global_batch,
            micro_batch=micro_batch,
            schedule=schedule,
            interleave=interleave,
            recompute=recompute,
            sequence_parallel=sequence_parallel,
            zero=zero,
            dtype=dtype,
            dp_overlap=dp_overlap,
            fused_attention=fused_attention,
            profile=profile,
            cost_model=cost_model,
            plan=planned,
            sensitivity=sensitivity,
            knobs=estimate_knobs(
                cp=cp,
                ep=ep,
                etp=etp,
                shard_size=shard_size,
                recompute_layers=recompute_layers,
                tp_overlap=tp_overlap,
                grad_reduce_dtype=grad_reduce_dtype,
                moe_imbalance=moe_imbalance,
                moe_dispatch=moe_dispatch,
                moe_overlap=moe_overlap,
                cp_comm=cp_comm,
                reshard_after_forward=reshard_after_forward,
                fsdp_step_gather=fsdp_step_gather,
                recompute_modules=recompute_modules,
                param_remainders=param_remainders,
                fsdp_fp32_params=fsdp_fp32_params,
                logit_bytes=logit_bytes,
                eager=eager,
                attention_kernel=attention_kernel,
            ),
        )
        if json_out:
            print_json(doc)
            return
        print_estimate(doc)
        print_plan(doc)
        if sensitivity:
            console.print(doc["bound_by_text"], highlight=False)


def print_estimate(doc: dict) -> None:
    """A rich table of one estimate, for people."""
    title = (
        f"{doc['model']} on {doc['num_gpus']} x {doc['hardware']}: dp={doc['dp']} tp={doc['tp']} "
        f"pp={doc['pp']} mbs={doc['micro_batch_size']} m={doc['num_microbatches']} "
        f"{doc['schedule']} v={doc['interleave']} zero={doc['zero_stage']} recompute={doc['recompute']} "
        f"sp={'on' if doc['sequence_parallel'] else 'off'} {doc['dtype']}"
        + (" fused-attention" if doc.get("fused_attention") else "")
        + "".join(f" {k}={doc[k]}" for k in ("cp", "ep", "etp") if doc.get(k, 1) > 1)
        + (f" shard={doc['shard_size']}" if doc.get("shard_size") else "")
        + (f" recompute-layers={doc['recompute_layers']}" if doc.get("recompute_layers") else "")
        + (" tp-overlap" if doc.get("tp_overlap") else "")
        + f" [{doc['cost_model']}]"
    )
    console.print(title, highlight=False)
    t = Table()
    t.add_column("term")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    total = doc["step_time_s"]
    for k in BREAKDOWN_TERMS:
        v = doc["breakdown"][k]
        t.add_row(k.removesuffix("_s"), f"{v:.4g}", f"{100 * v / total:.1f}%")
    t.add_row("[bold]step time[/bold]", f"[bold]{total:.4g}[/bold]", "100%")
    console.print(t)
    mem = doc["memory"]
    console.print(
        f"throughput {doc['throughput_samples_per_s']:.4g} samples/s, {doc['tokens_per_s']:.4g} tokens/s; "
        f"MFU {100 * doc['mfu']:.1f}%, HFU {100 * doc['hfu']:.1f}%; "
        f"{doc['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU"
    )
    console.print(
        f"memory per device {mem['total_bytes'] / units.GIB:.1f} GiB (weights {mem['weights_bytes'] / units.GIB:.1f}, "
        f"gradients {mem['gradients_bytes'] / units.GIB:.1f}, optimizer {mem['optimizer_bytes'] / units.GIB:.1f}, "
        f"activations {mem['activations_bytes'] / units.GIB:.1f}); "
        + (
            "[green]feasible[/green]"
            if doc["feasible"]
            else "[red]infeasible: "
            + ("does not fit in device memory" if not doc["fits_memory"] else "invalid strategy")
            + "[/red]"
        )
    )


def _register_grid() -> None:
    from aisim.perf_grid import grid_command

    app.command("grid")(grid_command)


_register_grid()


def _register_planning() -> None:
    from aisim.perf_compare import compare_command
    from aisim.perf_sensitivity import sensitivity_command

    app.command("sensitivity")(sensitivity_command)
    app.command("compare")(compare_command)


_register_planning()
