"""Prints the README's markdown table: the source document's DistIR rows against aisim's two cost
models (``--cost-model distir`` and the default ``aisim``).

Usage: ``.venv/bin/python docs/make_distir_table.py`` (no arguments; the seed CSVs are the copies
in ``calibration/data``). Every row of ``seed_distir_simulation.csv`` and ``seed_distir_vs_colossal.csv``
is printed. The aisim default runs on the ``a100-80gb`` preset (the source names no GPU).
Rows with pp = 1 use DistIR's single microbatch (micro-batch = batch / dp).
"""

from __future__ import annotations

from pathlib import Path

import jax
import pandas as pd

from perfmodel import load_hardware, load_model, make_strategy, select_step_fn

DATA = Path(__file__).resolve().parent.parent / "calibration" / "data"
HARDWARE = "a100-80gb"


def _predict(
    model: str, world: int, batch: int, dp: int, tp: int, pp: int, dtype: str, cost_model: str
) -> dict:
    """One strategy under one cost model. The step functions are called directly (not through
    ``aisim perf estimate``, which refuses a tp that does not divide the heads: the seed's gpt2
    rows use tp 8 with 12 or 20 heads, which DistIR allows)."""
    assert dp * tp * pp == world
    hw = load_hardware(HARDWARE)
    s = make_strategy(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=batch // dp,
        num_microbatches=1,
        dtype=dtype,
        recompute="none",
        gpus_per_node=hw.spec.gpus_per_node,
    )
    out = jax.jit(select_step_fn(cost_model))(load_model(model).spec, hw.spec, hw.constants, s)
    return {
        "throughput_samples_per_s": float(out.throughput_samples_per_s),
        "valid": bool(out.valid),
        "fits_memory": bool(out.fits_memory),
    }


def rows() -> list[dict]:
    """One dict per seed row: the seed value and both predictions (samples/s)."""
    out = []
    sim = pd.read_csv(DATA / "seed_distir_simulation.csv")
    vs = pd.read_csv(DATA / "seed_distir_vs_colossal.csv")
    frames = [
        ("seed_distir_simulation.csv", sim.assign(kind="simulated"), None),
        ("seed_distir_vs_colossal.csv", vs, "mlp-small"),
    ]
    for file, df, fixed_model in frames:
        for _, r in df.iterrows():
            model = fixed_model or r.model_size
            # the seed's mlp-small tp-8 row is DistIR's fp32 run; the dp-4 series is fp16
            dtype = (
                "fp32"
                if (file == "seed_distir_simulation.csv" and model == "mlp-small")
                else "fp16"
            )
            args = (
                model,
                int(r.world_size),
                int(r.batch_size),
                int(r.dp_degree),
                int(r.hp_degree),
                int(r.pp_degree),
                dtype,
            )
            d = _predict(*args, "distir")
            a = _predict(*args, "aisim")
            seed = None if pd.isna(r.throughput) else float(r.throughput)
            out.append(
                dict(
                    file=file,
                    row=int(r.row),
                    kind=r.kind,
                    model=model,
                    world=int(r.world_size),
                    batch=int(r.batch_size),
                    dp=int(r.dp_degree),
                    tp=int(r.hp_degree),
                    pp=int(r.pp_degree),
                    dtype=dtype,
                    seed=seed,
                    distir=d["throughput_samples_per_s"],
                    distir_flag=_flag(d),
                    aisim=a["throughput_samples_per_s"],
                    aisim_flag=_flag(a),
                )
            )
    return out


def _flag(d: dict) -> str:
    if not d["valid"]:
        return " (invalid: tp ∤ heads)"
    return "" if d["fits_memory"] else " (exceeds 80 GB)"


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}"


def markdown(table: list[dict]) -> str:
    """The rows as a markdown table (errors relative to the seed value)."""
    lines = [
        "| seed file | row | kind | model | dp·tp·pp | batch | dtype | seed samples/s | distir mode | error | aisim default | error |",
        "| --- | ---: | --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in table:

        def err(x, r=r):
            return "—" if r["seed"] is None else f"{(x / r['seed'] - 1.0) * 100:+.1f}%"

        flag_d, flag_a = r["distir_flag"], r["aisim_flag"]
        lines.append(
            f"| {r['file']} | {r['row']} | {r['kind']} | {r['model']} | {r['dp']}·{r['tp']}·{r['pp']} "
            f"| {r['batch']} | {r['dtype']} | {_fmt(r['seed'])} | {_fmt(r['distir'])}{flag_d} | "
            f"{err(r['distir'])} | {_fmt(r['aisim'])}{flag_a} | {err(r['aisim'])} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(rows()))
