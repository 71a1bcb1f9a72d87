"""`aisim perf`: one strategy (`estimate`), every strategy (`grid`), what limits a run
(`sensitivity`) and hardware side by side (`compare`).

Each command parses its options, calls one library function of :mod:`perfmodel` inside
:func:`~aisim.console.guard` (which names the option of a bad argument) and renders the result
(:mod:`aisim.perf_render`). The strategy knobs of every command come from the registry
(:func:`aisim.options.knob_options`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aisim import perf_render as render
from aisim.console import guard, print_json, wrote
from aisim.options import (
    FLAGS,
    OUTPUT,
    CostModelOpt,
    HardwareFileOpt,
    HardwareOpt,
    HardwaresOpt,
    HeadsOpt,
    HiddenOpt,
    JsonOpt,
    LayersOpt,
    ModelFileOpt,
    ModelOpt,
    ModelsOpt,
    OutOpt,
    ParamsOpt,
    PriceOpt,
    ProfileOpt,
    PueOpt,
    SensitivityOpt,
    SeqLenOpt,
    SetOpt,
    StackOpt,
    StacksOpt,
    TokensOpt,
    UtilisationOpt,
    VocabOpt,
    WidthsOpt,
    failure_options,
    knob_options,
    with_settings,
)
from calibration.profile import run_constants
from perfmodel import load_stack, resolve_hardware, resolve_model
from perfmodel.plan.compare import compare_hardware, compare_table
from perfmodel.plan.options import plan_options, with_price
from perfmodel.plan.reports import estimate_document, plan_grid
from perfmodel.plan.sensitivity import elasticity_table, sensitivity_report
from perfmodel.search.figures import plot_compare, plot_sweep
from perfmodel.search.sweep import sweep_stacks
from perfmodel.search.sweep_grid import grid_lists
from perfmodel.specs.stack_preset import with_caller_defaults
from simbase.errors import bad_value
from simbase.io import check_new_file, check_table_suffix, write_table
from simbase.parse import split_list
from simbase.prefetch import import_while_compiling

app = typer.Typer(no_args_is_help=True)

# what `aisim perf estimate` and `sensitivity` evaluate when not told: the README's GPT-3 run
ONE_RUN = dict(num_gpus=1024, tp=8, pp=8, global_batch_size=1536, recompute="full")

# fmt: off
TopOpt = Annotated[int, typer.Option("--top", help="How many strategies to show.",
                                     rich_help_panel=OUTPUT)]
RankOpt = Annotated[str, typer.Option("--rank-by", rich_help_panel=OUTPUT, help="throughput, cost, "
                                      "mfu, or (with --tokens) time, cost or energy to train.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a PNG figure.",
                                              rich_help_panel=OUTPUT)]
WideOpt = Annotated[bool, typer.Option("--wide", rich_help_panel=OUTPUT,
                                       help="Show every column, even wider than the terminal.")]
CrossNodeOpt = Annotated[bool, typer.Option("--allow-cross-node-tp", rich_help_panel="Layout",
                                            help="Let tensor parallelism span nodes.")]
GridOutOpt = Annotated[Path | None, typer.Option("--out", rich_help_panel=OUTPUT,
                       help="Write every feasible strategy (.csv, .parquet or .json).")]
BestOpt = Annotated[bool, typer.Option("--best", rich_help_panel="Layout",
                    help="Search the grid at this GPU count and batch; study its best.")]
CapacityOpt = Annotated[bool, typer.Option("--capacity/--no-capacity", rich_help_panel=OUTPUT,
                        help="Also what device memory changes.")]
CompareHwOpt = Annotated[list[str], typer.Option("--hardware", rich_help_panel="Hardware",
                         help="Hardware presets to compare, comma-separated.")]
CompareTokensOpt = Annotated[str, typer.Option("--tokens", rich_help_panel="Planning",
                             help="Tokens to train on, e.g. 15T or 300B.")]
GpusOpt = Annotated[int, typer.Option("--gpus", rich_help_panel="Layout",
                    help="Total devices on each hardware.")]
BatchOpt = Annotated[int, typer.Option("--global-batch", rich_help_panel="Batching",
                     help="Samples per optimiser step.")]
CompareRankOpt = Annotated[str, typer.Option("--rank-by", rich_help_panel=OUTPUT,
                           help="Each hardware's best by time, cost or energy.")]
# fmt: on


def _model(model, model_file, params=None, widths=None, dims=()):
    layers, hidden, heads, seq_len, vocab = dims or (None,) * 5
    return resolve_model(
        model, model_file=model_file, params=params, widths=widths, num_layers=layers,
        hidden_size=hidden, num_heads=heads, seq_len=seq_len, vocab_size=vocab,
    )  # fmt: skip


def _check_png(plot: Path | None) -> None:
    if plot is not None and plot.suffix.lower() != ".png":
        raise bad_value(None, "plot", str(plot), "a file name ending in .png")
    check_new_file(plot, "plot")


@app.command("estimate")
@knob_options(defaults=ONE_RUN)
@failure_options
def estimate_command(
    knobs: dict,
    model: ModelOpt = None,
    model_file: ModelFileOpt = None,
    params: ParamsOpt = None,
    widths: WidthsOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    heads: HeadsOpt = None,
    seq_len: SeqLenOpt = None,
    vocab: VocabOpt = None,
    hardware: HardwareOpt = None,
    hardware_file: HardwareFileOpt = None,
    profile: ProfileOpt = None,
    cost_model: CostModelOpt = "aisim",
    stack: StacksOpt = None,
    settings: SetOpt = None,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    failures=None,
    sensitivity: SensitivityOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Step-time breakdown, throughput, MFU and memory of one strategy, under each --stack."""
    with guard(FLAGS):
        plan = plan_options(tokens, price_per_gpu_hour, utilisation, pue)
        m = _model(model, model_file, params, widths, (layers, hidden, heads, seq_len, vocab))
        hw = with_price(resolve_hardware(hardware, hardware_file), price_per_gpu_hour)
        preset, given = _stacks_of(stack, profile), with_settings(knobs, settings)
        several = isinstance(preset, list)
        docs = [
            estimate_document(m, hw, run_constants(hw, profile, one),
                with_caller_defaults(given, ONE_RUN, one), cost_model=cost_model, stack=one,
                tokens=plan.tokens, failures=failures, sensitivity=sensitivity, given=given,
                **plan.power())
            for one in (preset if several else [preset])
        ]  # fmt: skip
        if json_out:
            return print_json(docs if several else docs[0])
        for doc in docs:
            render.print_estimate(doc)


@app.command("grid")
@knob_options(many=True, exclude=("dp", "num_microbatches"))
@failure_options
def grid_command(
    knobs: dict,
    model: ModelsOpt = None,
    model_file: ModelFileOpt = None,
    params: ParamsOpt = None,
    layers: LayersOpt = None,
    hidden: HiddenOpt = None,
    heads: HeadsOpt = None,
    seq_len: SeqLenOpt = None,
    vocab: VocabOpt = None,
    hardware: HardwaresOpt = None,
    hardware_file: HardwareFileOpt = None,
    profile: ProfileOpt = None,
    cost_model: CostModelOpt = "aisim",
    stack: StacksOpt = None,
    settings: SetOpt = None,
    allow_cross_node_tp: CrossNodeOpt = False,
    tokens: TokensOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    failures=None,
    top: TopOpt = 10,
    rank_by: RankOpt = "throughput",
    sensitivity: SensitivityOpt = False,
    out: GridOutOpt = None,
    plot: PlotOpt = None,
    wide: WideOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Every valid strategy, evaluated in one vectorised pass, ranked (default: GPT-3 175B on
    1024 x A100-80GB, global batch 1536); comma-separated models, hardware or stacks are each
    searched and ranked together."""
    import_while_compiling("pandas")  # for the results, while the grid compiles (simbase.prefetch)
    with guard(FLAGS):
        plan = plan_options(tokens, price_per_gpu_hour, utilisation, pue)
        check_table_suffix(out)
        _check_png(plot)
        dims = (layers, hidden, heads, seq_len, vocab)
        models = [_model(n, model_file, params, dims=dims) for n in split_list(model) or [None]]
        devices = [
            with_price(resolve_hardware(h, hardware_file), price_per_gpu_hour)
            for h in (split_list(hardware) or [None])[: 1 if hardware_file else None]
        ]
        values = grid_lists(with_settings(knobs, settings))
        preset = _stacks_of(stack, profile)
        with render.SweepProgress(enabled=not json_out) as progress:
            result = plan_grid(
                models, devices, tokens=plan.tokens,
                calibration_for=lambda hw, *one: run_constants(hw, profile, *one or (preset,)),
                price_per_gpu_hour_usd=price_per_gpu_hour, num_gpus=values.pop("num_gpus", None),
                global_batch=values.pop("global_batch_size", None), cost_model=cost_model,
                top=top, rank_by=rank_by, keep_all=out is not None,
                allow_cross_node_tp=allow_cross_node_tp, progress=progress, stack=preset,
                failures=failures, sensitivity=sensitivity, **plan.power(), **values,
            )  # fmt: skip
        doc = render.sweep_document(result)
        if out is not None and result.all_feasible is not None:
            write_table(result.all_feasible, out)
        if plot is not None:
            plot_sweep(doc, plot)
        if json_out:
            print_json(doc)
            return
        render.print_sweep(doc, wide=wide)
        wrote(out, what=f"{doc['feasible']} feasible strategies to ")
        wrote(plot)


def _stacks_of(stack: str | None, profile):
    """``--stack``: one stack, or a list of several comma-separated (a profile has one)."""
    names = split_list(stack) if stack is not None and "," in stack else None
    if names is None or len(names) == 1:  # "nemo," is one stack
        return load_stack(names[0] if names else stack)
    if profile is not None:
        raise bad_value(
            None, "stack", stack, "one stack with --profile (a profile is fitted under one)"
        )
    return sweep_stacks(names)


@app.command("sensitivity")
@knob_options(defaults=ONE_RUN)
def sensitivity_command(
    knobs: dict,
    model: ModelOpt = None,
    model_file: ModelFileOpt = None,
    hardware: HardwareOpt = None,
    hardware_file: HardwareFileOpt = None,
    profile: ProfileOpt = None,
    cost_model: CostModelOpt = "aisim",
    stack: StackOpt = None,
    settings: SetOpt = None,
    best: BestOpt = False,
    capacity: CapacityOpt = True,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """What limits a run: the elasticity of the step time to each hardware quantity and
    calibrated constant (jax.grad through the model), and what device memory changes."""
    with guard(FLAGS):
        check_table_suffix(out)
        m = _model(model, model_file)
        hw = resolve_hardware(hardware, hardware_file)
        preset = load_stack(stack, hw)
        given = with_settings(knobs, settings)
        run = given if best else with_caller_defaults(given, ONE_RUN, preset)  # best: searched
        gpus = run.pop("num_gpus", ONE_RUN["num_gpus"])
        batch = run.pop("global_batch_size", ONE_RUN["global_batch_size"])
        doc = sensitivity_report(
            m, hw, run_constants(hw, profile, preset).constants, num_gpus=int(gpus),
            global_batch=int(batch), knobs=run, best=best, capacity=capacity,
            cost_model=cost_model, stack=preset, given=given,
        )  # fmt: skip
        if out is not None:
            write_table(elasticity_table(doc), out)
        if json_out:
            print_json(doc)
            return
        render.print_sensitivity(doc)
        wrote(out)


@app.command("compare")
@knob_options(many=True, exclude=("dp", "num_microbatches", "num_gpus", "global_batch_size"))
@failure_options
def compare_command(
    knobs: dict,
    hardware: CompareHwOpt,
    tokens: CompareTokensOpt,
    model: ModelOpt = None,
    model_file: ModelFileOpt = None,
    gpus: GpusOpt = 1024,
    global_batch: BatchOpt = 1536,
    rank_by: CompareRankOpt = "time",
    profile: ProfileOpt = None,
    stack: StacksOpt = None,
    settings: SetOpt = None,
    price_per_gpu_hour: PriceOpt = None,
    utilisation: UtilisationOpt = None,
    pue: PueOpt = None,
    failures=None,
    plot: PlotOpt = None,
    out: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Hardware side by side: each one's best strategy, time, cost, energy; under each --stack."""
    with guard(FLAGS):
        check_table_suffix(out)
        _check_png(plot)
        plan = plan_options(tokens, price_per_gpu_hour, utilisation, pue)
        devices = [resolve_hardware(h) for h in split_list(hardware) or []]
        preset = _stacks_of(stack, profile)
        given = with_settings(knobs, settings)
        for name, option in (("num_gpus", "--gpus"), ("global_batch_size", "--global-batch")):
            if name in given:  # compare's own option, one value for every hardware
                raise bad_value(None, "set", f"{name}={given[name]}", f"{option} instead")
        doc = compare_hardware(
            _model(model, model_file), devices, tokens=plan.tokens, num_gpus=gpus,
            global_batch=global_batch, rank_by=rank_by,
            constants_for=lambda hw, *one: run_constants(hw, profile, *one or (preset,)).constants,
            stack=preset,
            price_per_gpu_hour_usd=price_per_gpu_hour, failures=failures, **plan.power(),
            **grid_lists(given),
        )  # fmt: skip
        if plot is not None:
            plot_compare(doc, plot)
        if out is not None:
            write_table(compare_table(doc), out)
        if json_out:
            print_json(doc)
            return
        render.print_compare(doc)
        wrote(plot, out)
