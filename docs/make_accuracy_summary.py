"""Prints the README's accuracy summary: every published measurement the tests use, aisim's prediction and error.

Run: ``python docs/make_accuracy_summary.py`` (about a minute on 2 cores). Each line is computed here,
from the shipped presets and the data files under ``calibration/data``; nothing is
typed in by hand except the published numbers themselves, which are read from those files or named
with their source below.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from calibration import (
    build_batch,
    fit,
    load_measurements,
    parse_free,
    predicted_step_time_s,
    resolve_rows,
)
from perfmodel import (
    enumerate_strategies,
    gpt_training_flops,
    load_hardware,
    load_model,
    make_strategy,
    step_time,
)
from perfmodel.search.reduce import search  # the documented on-device search

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
import make_accuracy_table  # noqa: E402
import make_distir_table  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "perfmodel" / "step"))
import test_bigscience176b as bigsci  # noqa: E402  (the two published rows and how they ran)

NARAYANAN_TFLOPS = 140.0  # Narayanan et al. SC21, §5.1: GPT-3 175B on 1024 A100-80GB, batch 1536


def _row(source: str, what: str, measured: str, aisim: str, error: str, test: str) -> str:
    return f"| {source} | {what} | {measured} | {aisim} | {error} | `{test}` |"


def korthikanti() -> list[str]:
    df = make_accuracy_table.korthikanti_rows()
    e = np.abs(df.error_pct.to_numpy())
    meas = load_measurements(
        ROOT / "calibration" / "data" / "korthikanti2022_table5_iteration_time.csv", purpose="fit"
    )
    rows = resolve_rows(meas)
    r = fit(
        parse_free(None, rows[0].hardware.constants),
        build_batch(rows),
        meas["measured_step_time_s"].to_numpy(),
    )
    src = "Korthikanti et al. 2022, Table 5"
    test = "tests/perfmodel/step/test_step_time.py, tests/calibration/test_fit.py"
    return [
        _row(
            src,
            "8 iteration times, 22B-1T on 8-512 A100 (uncalibrated)",
            "1.10-94.42 s",
            f"{df.aisim_s.min():.2f}-{df.aisim_s.max():.2f} s",
            f"mean {e.mean():.2f}%, max {e.max():.2f}%",
            test,
        ),
        _row(
            src,
            "the same 8, calibrated (held out: leave-one-out)",
            "",
            "",
            f"LOO mean {r.cv_mape_pct:.2f}%, max {np.abs(r.cv_error_pct).max():.2f}%; in-sample mean "
            f"{r.in_sample_mape_pct:.2f}%, max {r.in_sample_max_error_pct:.2f}% (Calculon: 3.65%, 8.87%)",
            test,
        ),
    ]


def _table1(hw) -> tuple[list[str], object]:
    """Table 1's 10 rows, uncalibrated and calibrated (leave-one-out), and the fit."""
    # Table 1 of the same paper (Megatron-LM's 2021 README image): the preset, then a fit on its 10 rows
    meas = load_measurements(
        ROOT / "calibration" / "data" / "narayanan2021_table1_weak_scaling.csv", purpose="fit"
    )
    rows = resolve_rows(meas)
    batch = build_batch(rows)
    measured = meas["measured_step_time_s"].to_numpy()
    pred = np.asarray(predicted_step_time_s(batch, hw.constants), float)
    pre = 100 * np.abs(pred / measured - 1)
    r = fit(parse_free(None, hw.constants), batch, measured)
    t1 = "Narayanan et al. SC21, Table 1"
    out = [
        _row(
            t1,
            "10 iteration times, 1.7B-1T on 32-3072 A100, Megatron-LM 2021 (uncalibrated)",
            f"{measured.min():.2f}-{measured.max():.2f} s",
            f"{pred.min():.2f}-{pred.max():.2f} s",
            f"mean {pre.mean():.2f}%, max {pre.max():.2f}%",
            "tests/calibration/test_narayanan2021.py",
        ),
        _row(
            t1,
            "the same 10, calibrated (held out: leave-one-out)",
            "",
            "",
            f"LOO mean {r.cv_mape_pct:.2f}%, max {np.abs(r.cv_error_pct).max():.2f}%; in-sample mean "
            f"{r.in_sample_mape_pct:.2f}%, max {r.in_sample_max_error_pct:.2f}%",
            "tests/calibration/test_narayanan2021.py",
        ),
    ]
    return out, r


def _korthikanti_from_table1(m, r) -> str:
    """Korthikanti et al. 2022's GPT-3 175B run with full recomputation, predicted from the fit."""
    k = load_measurements(
        ROOT / "calibration" / "data" / "korthikanti2022_table5_iteration_time.csv", purpose="fit"
    )
    i = k.index[(k["model"] == "gpt3-175b") & (k["recompute"] == "full")][0]
    krow = resolve_rows(k.loc[[i]])[0]
    kt = float(k.loc[i, "measured_step_time_s"])
    kp = float(np.asarray(predicted_step_time_s(build_batch([krow]), r.constants))[0])
    ktf = (
        float(gpt_training_flops(m.spec, krow.knobs["global_batch_size"], 1.0))
        / krow.knobs["num_gpus"]
        / kt
        / 1e12
    )
    return _row(
        "Korthikanti et al. 2022, Table 5",
        f"GPT-3 175B, 64 A100, full recomputation, tp 8 pp 8 v 3 ({ktf:.1f} TFLOP/s by eq. 3), "
        "predicted from the Table 1 fit (held out)",
        f"{kt:.2f} s",
        f"{kp:.2f} s",
        f"{100 * (kp / kt - 1):+.1f}%",
        "tests/calibration/test_narayanan2021.py",
    )


def _gpt3_1024(m, hw, r) -> list[str]:
    """§5.1's GPT-3 175B on 1024 A100: the paper's strategy and the grid's best, both constants."""
    flops = float(gpt_training_flops(m.spec, 1536, 1.0))
    paper = make_strategy(
        dp=8,
        tp=8,
        pp=16,
        micro_batch_size=1,
        num_microbatches=192,
        schedule="1f1b",
        recompute="full",
        dp_overlap=False,
        gpus_per_node=8,
    )
    g = enumerate_strategies(
        num_layers=96,
        num_heads=96,
        num_kv_heads=96,
        num_gpus=1024,
        global_batch=1536,
        gpus_per_node=8,
        recompute=["full"],
    )
    out = []
    src = "Narayanan et al. SC21, §5.1"
    for label, c, test in (
        ("", hw.constants, "tests/perfmodel/search/test_grid.py"),
        (", calibrated on Table 1", r.constants, "tests/calibration/test_narayanan2021.py"),
    ):
        best = search(m.spec, hw.spec, c, g, k=1).top.iloc[0]
        for what, secs in (
            (
                f"GPT-3 175B, 1024 A100, the paper's tp 8 pp 16 (eq. 3 TFLOP/s per GPU){label}",
                float(step_time(m.spec, hw.spec, c, paper).step_time_s),
            ),
            (
                f"the same, grid's best (dp{best['dp']} tp{best['tp']} pp{best['pp']} mbs"
                f"{best['micro_batch_size']} v{best['interleave']} ZeRO-{best['zero_stage']}){label}",
                float(best["step_time_s"]),
            ),
        ):
            tf = flops / secs / 1024 / 1e12
            out.append(
                _row(
                    src,
                    what,
                    f"{NARAYANAN_TFLOPS:.0f}",
                    f"{tf:.1f}",
                    f"{100 * (tf / NARAYANAN_TFLOPS - 1):+.1f}%",
                    test,
                )
            )
    return out


def narayanan() -> list[str]:
    m, hw = load_model("gpt3-175b"), load_hardware("a100-80gb")
    out, r = _table1(hw)
    return [*out, _korthikanti_from_table1(m, r), *_gpt3_1024(m, hw, r)]


def bigscience() -> list[str]:
    src, test = (
        "BigScience, BLOOM topology search (2022-02-28)",
        "tests/perfmodel/step/test_bigscience176b.py",
    )
    flops = float(gpt_training_flops(bigsci.BLOOM.spec, bigsci.GBS, 1.0))
    out = []
    for (dp, tp, pp), (_, measured) in bigsci.MEASURED.items():
        tf = flops / float(bigsci._predict(dp, tp, pp).step_time_s) / bigsci.GPUS / 1e12
        what = (
            f"176B on 384 A100-80GB, dp {dp} tp {tp} pp {pp}, ZeRO-1, mbs 2 (eq. 3 TFLOP/s per GPU; "
            "another cluster's network)"
        )
        out.append(
            _row(
                src,
                what,
                f"{measured:.2f}",
                f"{tf:.1f}",
                f"{100 * (tf / measured - 1):+.1f}%",
                test,
            )
        )
    return out


def distir() -> list[str]:
    rows = make_distir_table.rows()
    series = [
        r for r in rows if r["file"] == "seed_distir_vs_colossal.csv" and r["kind"] == "simulated"
    ]
    err = max(abs(r["distir"] / r["seed"] - 1) for r in series) * 100
    tp8 = next(
        r for r in rows if r["file"] == "seed_distir_simulation.csv" and r["model"] == "mlp-small"
    )
    e8 = 100 * (tp8["distir"] / tp8["seed"] - 1)
    colossal = next(r for r in rows if r["kind"] == "measured" and r["seed"] is not None)
    ec = 100 * (colossal["distir"] / colossal["seed"] - 1)
    ea = 100 * (colossal["aisim"] / colossal["seed"] - 1)
    src, test = "source document (DistIR)", "tests/perfmodel/step/test_distir.py"
    return [
        _row(
            src,
            "mlp-small dp 4, batch 4-128, simulated samples/s (`--cost-model distir`)",
            f"{series[0]['seed']:.2f}-{series[-1]['seed']:.2f}",
            f"{series[0]['distir']:.2f}-{series[-1]['distir']:.2f}",
            f"max {err:.2f}%",
            test,
        ),
        _row(
            src,
            "mlp-small tp 8, batch 128, fp32, simulated samples/s (`--cost-model distir`)",
            f"{tp8['seed']:,.2f}",
            f"{tp8['distir']:,.2f}",
            f"{e8:+.1f}%",
            test,
        ),
        _row(
            "source document (Colossal-AI)",
            "mlp-small dp 4, batch 4, measured samples/s, uncalibrated: distir / aisim",
            f"{colossal['seed']:.2f}",
            f"{colossal['distir']:.2f} / {colossal['aisim']:.2f}",
            f"{ec:+.1f}% / {ea:+.0f}%",
            "tests/calibration/test_fit.py",
        ),
    ]


def colossal_readme() -> list[str]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "pred.csv"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "aisim",
                "calibrate",
                "predict",
                str(ROOT / "calibration" / "data" / "colossalai_readme_benchmark.csv"),
                "--skip-bad-rows",
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        p = pd.read_csv(out)
    lines = []
    for r in p.itertuples():
        lines.append(
            _row(
                "Colossal-AI README benchmark",
                f"{r.model} on {int(r.num_gpus)} {r.hardware}, "
                f"ZeRO-{int(r.zero_stage)}, samples/s (uncalibrated)",
                f"{r.throughput_samples_per_s:.2f}",
                f"{r.predicted_throughput_samples_per_s:.2f}",
                f"{r.error_pct:+.1f}% step time",
                "tests/aisim/test_calibrate.py",
            )
        )
    return lines


def collab() -> list[str]:
    seed = ROOT / "calibration" / "data" / "seed_collab_mlp_2clients.csv"
    if not seed.exists():
        return []
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "aisim",
                "collab",
                "fit",
                str(seed),
                "--out",
                str(Path(d) / "p.json"),
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    if r.returncode != 0:
        return []
    doc = json.loads(r.stdout)
    return [
        _row(
            "source document (collaborative)",
            "2-client MLP 10M-100M: 30 shares in % (fitted)",
            "",
            "",
            f"RMS {doc['rms_error_pp']:.2f} pp",
            "tests/collab",
        )
    ]


def main() -> None:
    print("| source | what | published | aisim | error | checked by |")
    print("| --- | --- | ---: | ---: | --- | --- |")
    for part in (korthikanti, narayanan, bigscience, distir, colossal_readme, collab):
        for line in part():
            print(line)


if __name__ == "__main__":
    main()
