"""`aisim presets [hardware|models|stacks]`: lists the shipped hardware, model and software-stack
presets."""

from __future__ import annotations

from typing import Annotated

import typer

from aisim.console import fitted_table, guard, print_json, print_table
from perfmodel import explain, load_stack
from perfmodel.specs.catalog import hardware_rows, model_rows, stack_rows
from simbase import units
from simbase.errors import AisimError


def stack_table(rows: list[dict], *, wide: bool = False):
    """The stack presets for people: each one's fitted hardware (its runs)."""
    cells = [
        [r["name"], ", ".join(f"{hw} ({v['runs']})" for hw, v in r["fitted_on"].items()) or "-",
         r["description"]]
        for r in rows
    ]  # fmt: skip
    return fitted_table(
        ("name", "constants fitted on (runs)", "description"),
        cells,
        drop=("description",),
        left=("name", "constants fitted on (runs)", "description"),
        wide=wide,
        title="software stacks (other hardware: the preset's efficiencies, the stack's host costs)",
        title_justify="center",
    )


def explain_table(stack: str, rows: list[dict], *, wide: bool = False):
    """One stack's behaviours and recipe defaults for people, each with its source."""
    cells = [[r["kind"], r["knob"], r["value"], r["source"]] for r in rows]
    return fitted_table(
        ("kind", "knob", "value", "source"),
        cells,
        drop=("source",),
        left=("kind", "knob", "value", "source"),
        wide=wide,
        title=f"{stack}: behaviours, and recipe defaults for the knobs a user does not give",
        title_justify="center",
    )


HARDWARE_HEADERS = (
    "name",
    "bf16 TFLOP/s",
    "fp8 TFLOP/s",
    "HBM GiB",
    "HBM GB/s",
    "NVLink GB/s",
    "IB GB/s/GPU",
    "$/h",
    "board W",
)
# the least important first: board power only matters for the energy to train (--tokens)
HARDWARE_DROP = ("board W", "$/h", "IB GB/s/GPU", "NVLink GB/s", "HBM GB/s", "fp8 TFLOP/s")
MODEL_HEADERS = ("name", "kind", "params", "layers", "hidden", "heads", "kv", "seq", "vocab")
MODEL_DROP = ("kv", "vocab", "kind", "seq", "heads")


def hardware_table(rows: list[dict], *, wide: bool = False):
    """The hardware presets for people (peak bf16, or fp16 where there is no bf16; board W: the
    data sheet's maximum board power per device, "-" when unknown)."""
    cells = [
        [
            r["name"],
            _f(r["peak_bf16_tflops"] or r["peak_fp16_tflops"]),
            _f(r["peak_fp8_tflops"]),
            _f(r["memory_gib"]),
            _f(r["memory_bandwidth_gb_per_s"]),
            _f(r["intra_node_gb_per_s"]),
            _f(r["inter_node_gb_per_s"]),
            _f(r["price_per_device_hour_usd"]),
            _f(r["board_power_w"]),
        ]
        for r in rows
    ]
    return fitted_table(
        HARDWARE_HEADERS,
        cells,
        drop=HARDWARE_DROP,
        left=("name",),
        wide=wide,
        title="hardware presets",
        title_justify="center",
    )


def model_table(rows: list[dict], *, wide: bool = False):
    """The model presets for people."""
    cells = [
        [
            r["name"],
            r["kind"],
            units.format_count(r["params"]),
            str(r["num_layers"]),
            str(r["hidden_size"]),
            *(
                str(r[k]) if r[k] is not None else "-"
                for k in ("num_heads", "num_kv_heads", "seq_len", "vocab_size")
            ),
        ]
        for r in rows
    ]
    return fitted_table(
        MODEL_HEADERS,
        cells,
        drop=MODEL_DROP,
        left=("name", "kind"),
        wide=wide,
        title="model presets",
        title_justify="center",
    )


def presets(
    kind: Annotated[
        str, typer.Argument(help="hardware, models or stacks (default: all three)")
    ] = "all",
    name: Annotated[
        str | None,
        typer.Argument(help="With 'stacks': one stack's behaviours and defaults, with sources."),
    ] = None,
    wide: Annotated[
        bool,
        typer.Option("--wide", help="Show every column, even wider than the terminal."),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """List the shipped hardware, model and software-stack presets."""
    with guard():
        kind = kind.lower()
        if name is not None:
            if kind not in ("stacks", "stack"):
                raise AisimError(f"presets: argument 'name' = {name!r}: only 'stacks' takes a name")
            rows = explain(load_stack(name))
            if json_out:
                print_json({"stack": load_stack(name).name, "knobs": rows})
                return
            print_table(explain_table(load_stack(name).name, rows, wide=wide), wide=wide)
            return
        if kind not in ("all", "hardware", "models", "model", "stacks", "stack"):
            raise AisimError(
                f"presets: argument 'kind' = {kind!r}: expected hardware, models or stacks"
            )
        doc = {}
        if kind in ("all", "hardware"):
            doc["hardware"] = hardware_rows()
        if kind in ("all", "models", "model"):
            doc["models"] = model_rows()
        if kind in ("all", "stacks", "stack"):
            doc["stacks"] = stack_rows()
        if json_out:
            print_json(doc)
            return
        if "hardware" in doc:
            print_table(hardware_table(doc["hardware"], wide=wide), wide=wide)
        if "models" in doc:
            print_table(model_table(doc["models"], wide=wide), wide=wide)
        if "stacks" in doc:
            print_table(stack_table(doc["stacks"], wide=wide), wide=wide)


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}"
