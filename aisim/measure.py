"""`aisim measure`: time real JAX training steps on the devices at hand; write measurement rows.

A thin shell over :mod:`calibration.measure`: it resolves the model shape from a preset (with
small-size overrides) or a parameter count, checks every configuration before running any, shows
a progress bar on stderr, and writes the rows atomically in the measurement CSV schema.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Annotated

import typer

from aisim.console import (
    console,
    err_console,
    flag_names,
    guard,
    print_json,
    rich_table,
)
from simbase.errors import AisimError, bad_value
from simbase.io import check_table_suffix, write_table
from simbase.parse import parse_int_list

SHOWN = ("model", "hardware", "num_layers", "hidden_size", "num_gpus", "dp", "tp",
         "global_batch_size", "step_time_s", "throughput_samples_per_s")  # fmt: skip


# library field names (calibration.check_config, Shape) -> this command's flags
FLAGS = flag_names(
    global_batch_size="--global-batch",
    num_layers="--layers",
    hidden_size="--hidden",
    num_heads="--heads",
    num_kv_heads="--heads",
    ffn_hidden_size="--ffn",
    vocab_size="--vocab",
)


def _positive_ints(text: str, field: str) -> list[int]:
    """``"1,2,4"`` (or ``"1 2 4"``) -> ``[1, 2, 4]``; an error names ``field``."""
    try:
        return parse_int_list(re.sub(r"[,\s]+", ",", text.strip()), field, minimum=1) or []
    except AisimError:
        raise bad_value(None, field, text, "comma-separated positive integers") from None


def _shape(model: str | None, params: str | None, layers, hidden, heads, seq_len, vocab, ffn):
    """(model column, Shape) from a preset with overrides, or a square MLP of ``params``."""
    from calibration import measured_shape
    from perfmodel import load_model, mlp_from_params

    if (model is None) == (params is None):
        raise AisimError("give exactly one of --model NAME or --params COUNT (e.g. --params 20M)")
    name = "custom" if params is not None else model.strip().lower()
    spec = mlp_from_params(params).spec if params is not None else load_model(name).spec
    shape = measured_shape(spec, num_layers=layers, hidden_size=hidden, num_heads=heads,
                           seq_len=seq_len, vocab_size=vocab, ffn_hidden_size=ffn)  # fmt: skip
    if spec.kind == "mlp" and params is None and float(spec.input_size) != float(spec.output_size):
        raise AisimError(f"--model {name}: only square MLPs are measured (input = output)")
    h, n_heads = shape.hidden_size, shape.num_heads
    if spec.kind != "mlp" and (h % n_heads or n_heads % shape.num_kv_heads):
        raise bad_value(None, "num_heads", n_heads, f"a divisor of --hidden {h}")
    if shape.num_layers < 1 or shape.hidden_size < 1:
        raise AisimError("--layers and --hidden must be positive")
    return name, shape


def _jobs(model, params, dp, tp, global_batch, layers, hidden, heads, seq_len, vocab, ffn):
    """``(model column, Shape, Config)`` for every combination of the swept options."""
    from calibration import Config

    layer_list = [None] if layers is None else _positive_ints(layers, "layers")
    hidden_list = [None] if hidden is None else _positive_ints(hidden, "hidden")
    shapes = [_shape(model, params, n, h, heads, seq_len, vocab, ffn)
              for n, h in itertools.product(layer_list, hidden_list)]  # fmt: skip
    return [
        (name, shape, Config(dp=d, tp=t, global_batch_size=b))
        for (name, shape), d, t, b in itertools.product(
            shapes, _positive_ints(dp, "dp"), _positive_ints(tp, "tp"),
            _positive_ints(global_batch, "global_batch"),
        )
    ]  # fmt: skip


def measure(
    model: Annotated[
        str | None, typer.Option(help="Model preset (gpt2, llama2-7b, mlp-small, ...).")
    ] = None,
    params: Annotated[
        str | None, typer.Option(help="Square bias-free ReLU MLP of about this many parameters.")
    ] = None,
    dp: Annotated[str, typer.Option(help="Data-parallel degrees, comma-separated.")] = "1",
    tp: Annotated[str, typer.Option(help="Tensor-parallel degrees, comma-separated.")] = "1",
    global_batch: Annotated[
        str, typer.Option(help="Global batch sizes in samples, comma-separated.")
    ] = "8",
    seq_len: Annotated[int | None, typer.Option(help="Sequence length in tokens.")] = None,
    layers: Annotated[
        str | None, typer.Option(help="Override the number of layers (comma-separated: sweep).")
    ] = None,
    hidden: Annotated[
        str | None, typer.Option(help="Override the hidden size (comma-separated: sweep).")
    ] = None,
    heads: Annotated[int | None, typer.Option(help="Override the attention heads.")] = None,
    vocab: Annotated[int | None, typer.Option(help="Override the vocabulary size.")] = None,
    ffn: Annotated[int | None, typer.Option(help="Override the MLP hidden size.")] = None,
    steps: Annotated[int, typer.Option(help="Timed steps per configuration.")] = 5,
    warmup: Annotated[int, typer.Option(help="Untimed steps first (includes compiling).")] = 2,
    rounds: Annotated[
        int,
        typer.Option(
            help="Round-robin passes of --steps over all configurations "
            "(>1 spreads a shared host's contention; all stay in memory)."
        ),
    ] = 1,
    statistic: Annotated[
        str,
        typer.Option(
            help="step_time_s from the timed steps: median, or min (the least "
            "disturbed step, for a host shared with other work)."
        ),
    ] = "median",
    dtype: Annotated[str, typer.Option(help="Compute dtype: fp32, bf16 or fp16.")] = "fp32",
    hardware: Annotated[
        str | None, typer.Option(help="Hardware preset to record (default: from the devices).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights and data.")] = 0,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write rows to .csv, .parquet or .json.")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Times real flax training steps (data and tensor parallel) and writes measurement rows."""
    with guard(FLAGS):
        import jax
        import pandas as pd
        from rich.progress import Progress

        from calibration import (
            COMPUTE_DTYPES,
            STATISTICS,
            check_config,
            hardware_for_devices,
            measure_many,
            shape_columns,
        )  # fmt: skip

        check_table_suffix(out)
        if dtype not in COMPUTE_DTYPES:
            raise bad_value(None, "dtype", dtype, "one of " + ", ".join(COMPUTE_DTYPES))
        if statistic not in STATISTICS:
            raise bad_value(None, "statistic", statistic, "one of " + ", ".join(STATISTICS))
        if steps < 1 or warmup < 0 or rounds < 1:
            raise AisimError("--steps and --rounds must be at least 1 and --warmup at least 0")
        jobs = _jobs(model, params, dp, tp, global_batch, layers, hidden, heads, seq_len, vocab,
                     ffn)  # fmt: skip
        devices = jax.devices()
        for _, shape, cfg in jobs:
            check_config(shape, cfg, len(devices))
        hw = hardware_for_devices(devices, hardware)
        with Progress(console=err_console, transient=True, disable=json_) as progress:
            task = progress.add_task("measuring", total=len(jobs))
            got = measure_many([(shape, cfg) for _, shape, cfg in jobs], steps=steps,
                               warmup=warmup, rounds=rounds, statistic=statistic, dtype=dtype,
                               seed=seed, devices=devices,
                               on_done=lambda i: progress.advance(task))  # fmt: skip
        rows = [{**shape_columns(name, shape), "hardware": hw, **g}
                for (name, shape, _), g in zip(jobs, got, strict=True)]  # fmt: skip
        df = pd.DataFrame(rows)
        if out is not None:
            write_table(df, out)
        if json_:
            print_json({"rows": df.to_dict(orient="records"), "out": str(out) if out else None})
            return
        console.print(rich_table(df[list(SHOWN)], title=f"{len(df)} measured configurations"))
        if out is not None:
            console.print(f"wrote {len(df)} rows to {out}")
