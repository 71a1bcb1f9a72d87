"""The command line's shared options, the strategy knobs among them derived from the registry.

Contract: every command that takes a strategy wraps its function in :func:`knob_options`, which
adds one option per knob of :data:`perfmodel.specs.knobs.KNOBS` (its flag, help text and panel
come from the registry) and hands the function a ``knobs`` dict of the knobs the user gave, as
typed (the library parses and checks them, and :data:`FLAGS` names the option of any field it
rejects). With ``many=True`` (a grid) each option takes several values, comma-separated or
repeated. The other options shared by several commands (model, hardware, profile, stack,
planning, output) are declared once here, each in its help panel.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from perfmodel.specs.knobs import KNOBS, PANELS, PARALLEL_DEGREES, canonical
from simbase.errors import bad_value

Multi = list[str] | None
MODEL, HARDWARE, PLANNING, OUTPUT = "Model", "Hardware", "Planning", "Output"

# library field -> option, for every knob and the other fields the libraries name
FLAGS: dict[str, str] = {k.name: k.option for k in KNOBS} | {
    "num_layers": "--layers",
    "hidden_size": "--hidden",
    "num_heads": "--heads",
    "vocab_size": "--vocab",
    "price_per_gpu_hour_usd": "--price-per-gpu-hour",
    "utilisation_factor": "--utilisation",
    "global_batch": "--global-batch",
}


def _opt(*names: str, panel: str, **kw) -> typer.models.OptionInfo:
    return typer.Option(*names, rich_help_panel=panel, **kw)


ModelOpt = Annotated[
    str | None,
    _opt("--model", panel=MODEL, help="Model preset (any case; default gpt3-175b), or 'custom' "
         "with --layers --hidden --heads --seq-len --vocab."),
]  # fmt: skip
ModelsOpt = Annotated[
    Multi,
    _opt("--model", panel=MODEL, help="Model preset(s), comma-separated (default gpt3-175b); "
         "'custom' with --layers --hidden --heads --seq-len --vocab."),
]  # fmt: skip
ModelFileOpt = Annotated[
    Path | None,
    _opt("--model-file", panel=MODEL, help="Your own model JSON (the presets' schema)."),
]
ParamsOpt = Annotated[
    str | None,
    _opt(
        "--params", panel=MODEL, help="A square bias-free MLP of about this many parameters (60M)."
    ),
]
WidthsOpt = Annotated[
    str | None, _opt("--widths", panel=MODEL, help="A generic MLP by its widths (784,200,10).")
]
LayersOpt = Annotated[int | None, _opt("--layers", panel=MODEL, help="Transformer layers.")]
HiddenOpt = Annotated[int | None, _opt("--hidden", panel=MODEL, help="Hidden size.")]
HeadsOpt = Annotated[int | None, _opt("--heads", panel=MODEL, help="Attention heads.")]
SeqLenOpt = Annotated[int | None, _opt("--seq-len", panel=MODEL, help="Sequence length in tokens.")]
VocabOpt = Annotated[int | None, _opt("--vocab", panel=MODEL, help="Vocabulary size.")]
HardwareOpt = Annotated[
    str | None, _opt("--hardware", panel=HARDWARE, help="Hardware preset (default a100-80gb).")
]
HardwaresOpt = Annotated[
    Multi,
    _opt("--hardware", panel=HARDWARE, help="Hardware preset(s) (default a100-80gb); several "
         "give the cheapest per token."),
]  # fmt: skip
HardwareFileOpt = Annotated[
    Path | None, _opt("--hardware-file", panel=HARDWARE, help="Your own hardware JSON.")
]
ProfileOpt = Annotated[
    Path | None,
    _opt("--profile", panel=HARDWARE, help="Calibrated profile JSON (`aisim calibrate fit`)."),
]
CostModelOpt = Annotated[
    str, _opt("--cost-model", panel=HARDWARE, help="aisim, or distir (DistIR's formulas).")
]
StackOpt = Annotated[
    str | None,
    _opt("--stack", panel=PANELS["stack"], help="Software stack: a preset name, a framework's "
         "name (nemo, megatron-lm, fsdp, ...) or a stack JSON file; its behaviours and recipe "
         "defaults apply where no option says otherwise."),
]  # fmt: skip
StacksOpt = Annotated[str | None, _opt("--stack", panel=PANELS["stack"], help="Software stack(s): "
    "preset or framework names or JSON files, comma-separated; each searched with its defaults.")]  # fmt: skip
SetOpt = Annotated[
    Multi,
    _opt("--set", panel=PANELS["stack"], metavar="KNOB=VALUE",
         help="Set any knob by its name, e.g. --set eager=on (repeatable)."),
]  # fmt: skip
TokensOpt = Annotated[
    str | None,
    _opt("--tokens", panel=PLANNING, help="Tokens to train on (15T, 300B): adds days, "
         "GPU-hours, dollars and MWh."),
]  # fmt: skip
PriceOpt = Annotated[
    float | None,
    _opt("--price-per-gpu-hour", panel=PLANNING, help="USD per GPU-hour (default: the preset's)."),
]
UtilisationOpt = Annotated[
    float | None,
    _opt("--utilisation", panel=PLANNING, help="Mean power draw as a fraction of board power."),
]
PueOpt = Annotated[
    float | None, _opt("--pue", panel=PLANNING, help="The facility's power usage effectiveness.")
]
SensitivityOpt = Annotated[
    bool,
    _opt("--sensitivity", panel=OUTPUT, help="Add the step time's elasticities and what "
         "bounds the run (for a grid, of its best strategy)."),
]  # fmt: skip
JsonOpt = Annotated[bool, _opt("--json", panel=OUTPUT, help="Print one JSON document.")]
OutOpt = Annotated[
    Path | None, _opt("--out", panel=OUTPUT, help="Write the table (.csv, .parquet or .json).")
]


def _metavar(knob) -> str:
    if knob.metavar:
        return knob.metavar
    if knob.words():
        return "NAME"
    return {int: "INT", float: "NUMBER"}.get(knob.kind, "VALUE")


def _param(name: str, annotation) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def _alias_params(knob, annotation_of) -> list[inspect.Parameter]:
    """Hidden options for the knob's other spellings (``--num-gpus`` for ``--gpus``)."""
    return [
        _param(f"{knob.name}__{i}", annotation_of(typer.Option(flag, hidden=True)))
        for i, flag in enumerate(knob.flag_aliases)
    ]


def _knob_params(knob, many: bool, shown: Any) -> list[inspect.Parameter]:
    """One knob's options: a value, several values, or for a switch a ``--x`` flag with a
    hidden ``--no-x`` (one column of ``--help``, readable in 80 columns)."""
    panel = PANELS.get(knob.home or ("layout" if knob.name == "num_gpus" else "batching"))
    words = knob.words()
    listed = all(w in knob.help for w in words)
    choices = f" ({', '.join(words)})" if words and not listed else ""
    default = {} if shown is None else {"show_default": knob.text(knob.parse(shown))}
    if shown is not None and knob.name in PARALLEL_DEGREES:  # with_caller_defaults
        default["show_default"] += ", or 1 where another degree is given"
    if many:
        several = "on, off or both" if knob.kind is bool else "several, comma-separated"
        info = typer.Option(
            knob.option, help=f"{knob.help}{choices} Grid: {several}.",
            rich_help_panel=panel, metavar="LIST", **({"show_default": False} | default),
        )  # fmt: skip
        return [_param(knob.name, Annotated[Multi, info])] + _alias_params(
            knob, lambda i: Annotated[Multi, i]
        )
    if knob.kind is bool:
        off = "--no-" + knob.option[2:]
        on_info = typer.Option(
            knob.option, help=f"{knob.help} ({off}: off)", rich_help_panel=panel,
            metavar=" ", **({"show_default": False} | default),
        )  # fmt: skip
        off_info = typer.Option(off, hidden=True)
        return [
            _param(knob.name, Annotated[bool | None, on_info]),
            _param("no_" + knob.name, Annotated[bool | None, off_info]),
        ]
    info = typer.Option(
        knob.option, help=knob.help + choices, rich_help_panel=panel,
        metavar=_metavar(knob), **({"show_default": False} | default),
    )  # fmt: skip
    return [_param(knob.name, Annotated[str | None, info])] + _alias_params(
        knob, lambda i: Annotated[str | None, i]
    )


def knob_options(
    *, many: bool = False, defaults: dict[str, Any] | None = None, exclude=(), include=None
):
    """Adds an option per registry knob to a command whose function takes ``knobs``.

    Args:
      many: a grid: each option takes several values
        (:func:`perfmodel.search.sweep_grid.grid_lists` reads them).
      defaults: the command's own defaults, shown in ``--help`` (the command applies them:
        :func:`perfmodel.specs.stack_preset.with_caller_defaults`).
      exclude: knobs the command does not take (a grid derives ``dp`` and the microbatches).
      include: only these knobs (a command that overrides some knobs of a file's rows).
    """
    defaults = defaults or {}

    def wrap(fn):
        sig = inspect.signature(fn, eval_str=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in sig.parameters.values()
            if p.name != "knobs"
        ]
        taken = [
            k for k in KNOBS if k.name not in exclude and (include is None or k.name in include)
        ]
        extra = [p for k in taken for p in _knob_params(k, many, defaults.get(k.name))]

        @functools.wraps(fn)
        def command(**kwargs):
            given = {}
            for k in taken:
                value, off = kwargs.pop(k.name), kwargs.pop("no_" + k.name, None)
                if value and off:
                    raise typer.BadParameter(f"{k.option} and --no-{k.option[2:]} together")
                for i in range(len(k.flag_aliases)):
                    alias = kwargs.pop(f"{k.name}__{i}")
                    value = alias if value is None else value
                given[k.name] = False if off else value
            given = {k: v for k, v in given.items() if v is not None}
            return fn(knobs=given, **kwargs)

        at = next((i for i, p in enumerate(own) if p.name == "stack"), len(own))
        params = own[:at] + extra + own[at:]
        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer reads the signature above, not the function's
        return command

    return wrap


def with_settings(knobs: dict[str, Any], settings: list[str] | None) -> dict[str, Any]:
    """The knobs with each ``--set KNOB=VALUE`` added (any registry spelling of the knob).

    Raises:
      AisimError: (field ``set``) a setting that is not ``KNOB=VALUE``, an unknown knob, or a
        knob also given by its own option.
    """
    out = dict(knobs)
    for item in settings or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise bad_value(None, "set", item, "KNOB=VALUE, e.g. eager=on")
        try:
            (name,) = canonical({key.strip(): value}).keys()
        except Exception:
            raise bad_value(None, "set", item, "a knob of the registry (see --help)") from None
        if name in knobs:
            raise bad_value(None, "set", item, f"one value of {name}: its option gives one too")
        out[name] = value.strip()
    return out


RELIABILITY = "Failures and checkpoints"
# option -> (library argument of perfmodel.plan.failure_model.failure_model, annotation)
_RELIABILITY_OPTIONS = {
    "no_failures": Annotated[bool, typer.Option("--no-failures", rich_help_panel=RELIABILITY,
        help="Time to train without failures, checkpoints or stragglers.")],
    "mtbf_hours": Annotated[float | None, typer.Option("--mtbf", rich_help_panel=RELIABILITY,
        metavar="HOURS", help="Your fleet's mean time between unplanned interruptions (default: "
        "the hardware's published component rates).")],
    "mtbf_per": Annotated[str, typer.Option("--mtbf-per", rich_help_panel=RELIABILITY,
        metavar="NAME", help="What --mtbf is per: job, node or gpu.")],
    "checkpoint_interval_s": Annotated[float | None, typer.Option("--checkpoint-interval",
        rich_help_panel=RELIABILITY, metavar="SECONDS",
        help="Compute seconds between checkpoints (default: Daly's optimum).")],
    "interval_rule": Annotated[str, typer.Option("--interval-rule", rich_help_panel=RELIABILITY,
        metavar="NAME", help="The optimal interval's formula: daly or young.")],
    "storage": Annotated[str | None, typer.Option("--storage", rich_help_panel=RELIABILITY,
        metavar="NAME", help="Checkpoint storage: local-nvme, pfs or object-store (default pfs).")],
    "sync_checkpoint": Annotated[bool, typer.Option("--sync-checkpoint",
        rich_help_panel=RELIABILITY, help="Training waits for each checkpoint write.")],
    "restart_overhead_s": Annotated[float | None, typer.Option("--restart-overhead",
        rich_help_panel=RELIABILITY, metavar="SECONDS",
        help="Seconds to detect, reschedule and warm up after a failure.")],
    "straggler_cv": Annotated[float | None, typer.Option("--straggler-spread",
        rich_help_panel=RELIABILITY, metavar="CV",
        help="Per-GPU speed spread (a fraction; 0 = none; default: the published one).")],
    "straggler_distribution": Annotated[str | None, typer.Option("--straggler-distribution",
        rich_help_panel=RELIABILITY, metavar="NAME", help="lognormal or normal.")],
    "no_planned": Annotated[bool, typer.Option("--no-planned-interruptions",
        rich_help_panel=RELIABILITY, help="Leave out planned (maintenance) interruptions.")],
}  # fmt: skip
_RELIABILITY_DEFAULTS = {
    "no_failures": False, "mtbf_per": "job", "interval_rule": "daly", "sync_checkpoint": False,
    "no_planned": False,
}  # fmt: skip
FLAGS |= {
    "mtbf_hours": "--mtbf", "checkpoint_interval_s": "--checkpoint-interval",
    "restart_overhead_s": "--restart-overhead", "straggler_cv": "--straggler-spread",
    "async_checkpoint": "--sync-checkpoint", "planned": "--no-planned-interruptions",
}  # fmt: skip


def failure_options(fn):
    """Adds the failure and checkpoint options to a command whose function takes
    ``failures``: ``None`` with ``--no-failures``, else a function of the hardware that builds
    its :func:`perfmodel.plan.failure_model.failure_model` with the user's overrides."""
    sig = inspect.signature(fn, eval_str=True)
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()]
    extra = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=a,
                          default=_RELIABILITY_DEFAULTS.get(n))
        for n, a in _RELIABILITY_OPTIONS.items()
    ]  # fmt: skip
    at = next(i for i, p in enumerate(own) if p.name == "failures")

    @functools.wraps(fn)
    def command(**kwargs):
        o = {n: kwargs.pop(n) for n in _RELIABILITY_OPTIONS}
        if o.pop("no_failures"):
            return fn(failures=None, **kwargs)
        from perfmodel.plan.failure_model import failure_model

        args = dict(
            o, async_checkpoint=not o.pop("sync_checkpoint"), planned=not o.pop("no_planned")
        )
        failure_model(None, **args)  # checks the options before any work
        return fn(failures=lambda hw: failure_model(hw, **args), **kwargs)

    params = own[:at] + extra + own[at + 1 :]
    command.__signature__ = sig.replace(parameters=params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    del command.__wrapped__
    return command
