"""Option resolution shared by the CLI areas: model, hardware and profile from flags."""

from __future__ import annotations

from pathlib import Path

from calibration.profile import load_profile_constants
from perfmodel.constants import Constants
from perfmodel.hardware import Hardware, load_hardware, load_hardware_file
from perfmodel.workload import (
    Model,
    load_model,
    load_model_file,
    mlp_from_params,
    mlp_from_widths,
    with_overrides,
)
from simbase import units
from simbase.errors import AisimError, bad_value


def resolve_model(
    model: str | None = None,
    *,
    model_file: Path | None = None,
    params: str | None = None,
    widths: str | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> Model:
    """A model from ``--model NAME`` (or ``custom`` with dimensions), ``--model-file``,
    ``--params 60M`` (the standard square MLP) or ``--widths 784,200,200,10``."""
    given = [
        x
        for x in (
            model if model and model.lower() != "custom" else None,
            model_file,
            params,
            widths,
        )
        if x
    ]
    if len(given) > 1:
        raise AisimError("give only one of --model, --model-file, --params and --widths")
    dims = dict(
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=ffn_hidden,
        seq_len=seq_len,
        vocab_size=vocab,
    )
    for k, v in dims.items():
        if v is not None and v < 1:
            raise bad_value("command line", k, v, "a positive integer")
    if model_file is not None:
        m = load_model_file(model_file)
    elif params is not None:
        m = mlp_from_params(params)
    elif widths is not None:
        try:
            ws = [int(w) for w in widths.split(",")]
        except ValueError:
            raise bad_value(
                "--widths", "widths", widths, "comma-separated integers like 784,200,200,10"
            ) from None
        m = mlp_from_widths(ws)
    elif model is not None and model.lower() == "custom":
        from perfmodel.workload import model_from_dict

        missing = [
            f"--{n}"
            for n, v in (
                ("layers", layers),
                ("hidden", hidden),
                ("heads", heads),
                ("seq-len", seq_len),
                ("vocab", vocab),
            )
            if v is None
        ]
        if missing:
            raise AisimError(f"--model custom needs {', '.join(missing)}")
        doc = {k: v for k, v in dims.items() if v is not None}
        doc.update(kind="transformer", name="custom")
        return model_from_dict(doc, "command line")
    else:
        m = load_model(model or "gpt3-175b")
    return with_overrides(m, **dims) if any(v is not None for v in dims.values()) else m


def resolve_hardware(name: str | None = None, hardware_file: Path | None = None) -> Hardware:
    """A hardware preset by name (case-insensitive) or a user file."""
    if hardware_file is not None:
        return load_hardware_file(hardware_file)
    return load_hardware(name or "a100-80gb")


def resolve_constants(hw: Hardware, profile: Path | None) -> Constants:
    """The preset's constants, or a calibrated profile's over them."""
    if profile is None:
        return hw.constants
    return load_profile_constants(profile, hw.name, hw.constants)


def parse_int_list(text: str | None, option: str, *, minimum: int = 0) -> list[int] | None:
    """``"1,2,4"`` -> ``[1, 2, 4]``; also ``"64,128,...,4096"`` (doubling). ``None`` stays ``None``."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    out: list[int] = []
    try:
        for i, p in enumerate(parts):
            if p == "...":
                if len(out) < 2 or i + 1 >= len(parts):
                    raise ValueError
                a, b = out[-2], out[-1]
                end = int(float(parts[i + 1]))
                ratio = b / a if a else 0
                step = b - a
                x = b
                while True:
                    x = int(x * ratio) if ratio > 1 and a and b % a == 0 else x + step
                    if x >= end or x <= 0:
                        break
                    out.append(x)
                continue
            v = float(units.parse_count(p))
            if v != int(v):
                raise ValueError
            out.append(int(v))
    except ValueError:
        raise bad_value(
            "command line", option, text, "comma-separated integers like 1,2,4 or 64,128,...,4096"
        ) from None
    bad = [v for v in out if v < minimum]
    if not out or bad:
        raise bad_value("command line", option, text, f"integers >= {minimum}")
    return out
