"""The failure model of a training run: hand calculations (Young/Daly intervals, lost work),
the expected maximum of N draws and Daly's segment time against seeded Monte-Carlo runs, the
published checks (Llama 3's 54 days on 16,384 H100s; Kokolis et al.'s job MTTF against job
size), and planning with failures switched off bit for bit as the formulas without them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from perfmodel import estimate, hardware_names, load_hardware
from perfmodel.plan.failure_model import (
    PROFILE,
    StorageTier,
    failure_model,
    pooled_rate,
    storage_names,
)
from perfmodel.plan.goodput import goodput_order
from perfmodel.plan.reliability import (
    checkpoint_bytes,
    checkpoint_io,
    daly_interval_s,
    expected_lost_work_s,
    expected_segment_s,
    failure_plan,
    job_rates,
    lost_work_moments,
    straggler_slowdown,
    train_days_bounds,
    young_interval_s,
)
from perfmodel.plan.training import plan_for, plan_frame, plan_sweep, plan_training
from perfmodel.specs.model import load_model, total_params
from simbase.errors import AisimError

DAY_S = 86400.0
LLAMA3 = PROFILE["checks"]["llama3"]
KOKOLIS_MTTF_H = PROFILE["checks"]["kokolis_job_mttf_hours"]


def _per_day(rates) -> float:
    return (rates.unplanned_per_s + rates.planned_per_s) * DAY_S


# ---------------------------------------------------------------- hand calculations


def test_young_and_daly_intervals_by_hand():
    # delta = 60 s, M = 1 day: Young sqrt(2 * 60 * 86400) = sqrt(10,368,000) = 3219.94 s;
    # Daly x = 60 / 172800 = 3.472e-4: 3219.94 * (1 + 0.018634/3 + 3.858e-5) - 60 = 3180.06 s
    assert young_interval_s(60.0, 86400.0) == pytest.approx(3219.9379, rel=1e-7)
    assert daly_interval_s(60.0, 86400.0) == pytest.approx(3180.0621, rel=1e-7)
    # Daly's rule for a checkpoint longer than twice the MTBF: checkpoint every M
    assert daly_interval_s(5000.0, 2000.0) == 2000.0
    assert daly_interval_s(60.0, math.inf) == math.inf


def test_daly_interval_minimises_the_expected_wall_time():
    # Daly's interval is an approximation to the minimum of his own model's wall time per unit
    # of progress, E[T_seg]/tau; brute force finds that minimum
    delta, restart, mtbf = 120.0, 600.0, 4 * 3600.0
    taus = np.linspace(300.0, 6000.0, 20001)
    waste = np.asarray(expected_segment_s(taus, delta, restart, mtbf)) / taus
    best = taus[np.argmin(waste)]
    daly, young = daly_interval_s(delta, mtbf), young_interval_s(delta, mtbf)
    assert abs(daly - best) < abs(young - best)
    assert daly == pytest.approx(best, rel=0.01)
    at_daly = expected_segment_s(daly, delta, restart, mtbf) / daly
    assert at_daly - waste.min() < 1e-5


def test_expected_lost_work_by_hand():
    # a 2-hour segment, failures every hour on average: E[x] = M - L e^{-L/M} / (1 - e^{-L/M})
    # = 3600 - 7200 * 0.135335 / 0.864665 = 2473.07 s, not the L/2 = 3600 of rare failures
    assert expected_lost_work_s(7200.0, 3600.0) == pytest.approx(2473.073, rel=1e-6)
    # rare failures lose half a segment; the series and the formula meet at L/M = 1e-3
    assert expected_lost_work_s(3660.0, 1e12) == pytest.approx(1830.0, rel=1e-8)
    below = lost_work_moments(3600.0 * 0.999e-3 * 1e3, 3.6e6)
    above = lost_work_moments(3600.0 * 1.001e-3 * 1e3, 3.6e6)
    assert above[0] / below[0] == pytest.approx(1.002, rel=1e-5)
    assert above[1] / below[1] == pytest.approx(1.002**2, rel=1e-5)
    # the second moment of a uniform loss is L^2/3
    assert lost_work_moments(100.0, math.inf)[1] == pytest.approx(1e4 / 3)


def test_daly_segment_time_against_monte_carlo():
    # a segment of tau + delta succeeds only without a failure; each failure costs a restart R
    # that can itself fail (Daly 2006): simulate it
    tau, delta, restart, mtbf = 1800.0, 60.0, 300.0, 7200.0
    trials = 20000
    rng = np.random.default_rng(7)
    walls = []
    for _ in range(trials):
        t = 0.0
        while True:
            f = rng.exponential(mtbf)
            if f >= tau + delta:
                t += tau + delta
                break
            t += f
            while True:  # the restart, repeated until it completes
                f2 = rng.exponential(mtbf)
                if f2 >= restart:
                    t += restart
                    break
                t += f2
        walls.append(t)
    walls = np.asarray(walls)
    expected = expected_segment_s(tau, delta, restart, mtbf)
    assert walls.mean() == pytest.approx(expected, abs=3 * walls.std() / math.sqrt(trials))


def test_wall_time_spread_against_monte_carlo():
    # the compound-Poisson standard deviation of a run's wall time against simulated runs
    fm = failure_model(
        "h100-sxm", mtbf_hours=2.0, planned=False, straggler_cv=0.0, checkpoint_interval_s=1800.0
    )
    plan = failure_plan(fm, num_gpus=8, useful_s=100 * 1800.0, checkpoint_bytes=0.0)
    tau, mtbf = 1800.0, 7200.0
    cost = plan.restart_s  # no checkpoint bytes: nothing written, nothing in flight
    rng = np.random.default_rng(11)
    runs = []
    for _ in range(3000):
        t = 0.0
        for _ in range(100):
            while True:
                f = rng.exponential(mtbf)
                if f >= tau:
                    t += tau
                    break
                t += f + cost
        runs.append(t)
    runs = np.asarray(runs)
    assert plan.wall_s == pytest.approx(runs.mean(), rel=0.02)
    assert plan.train_days_sd * DAY_S == pytest.approx(runs.std(), rel=0.15)


def test_checkpoint_size_and_write_time_by_hand():
    # mixed precision: 2 bytes of weights + 12 of fp32 master, momentum and variance
    assert checkpoint_bytes(1e9, "bf16") == 14e9
    assert checkpoint_bytes(1e9, "fp32") == 12e9
    tier = StorageTier("t", 10e9, 20e9, 50e9, 60e9)
    io = checkpoint_io(tier, 100e9, 2)  # 2 nodes x 10 GB/s < 50 GB/s
    assert (io.write_s, io.read_s) == (5.0, 2.5)
    io = checkpoint_io(tier, 100e9, 100)  # the aggregate limits: 50 and 60 GB/s
    assert io.write_s == 2.0 and io.read_s == pytest.approx(100 / 60)
    fm = failure_model("h100-sxm", storage=tier, async_checkpoint=False)
    sync = failure_plan(fm, num_gpus=16, useful_s=1e6, checkpoint_bytes=100e9)
    fm_async = failure_model("h100-sxm", storage=tier)
    lazy = failure_plan(fm_async, num_gpus=16, useful_s=1e6, checkpoint_bytes=100e9)
    assert sync.checkpoint_blocking_s == sync.checkpoint_write_s == 5.0
    frac = PROFILE["checkpoint"]["async_blocking_fraction"]
    assert lazy.checkpoint_blocking_s == pytest.approx(5.0 * frac)
    assert lazy.checkpoint_interval_s >= lazy.checkpoint_write_s


# ---------------------------------------------------------------- stragglers


@pytest.mark.parametrize("distribution", ["normal", "lognormal"])
@pytest.mark.parametrize("n", [2, 8, 64, 1024])
def test_expected_max_against_monte_carlo(distribution, n):
    cv, trials = 0.05, 4000
    rng = np.random.default_rng(n)
    z = rng.standard_normal((trials, n))
    if distribution == "normal":
        draws = 1.0 + cv * z
    else:
        s = math.sqrt(math.log1p(cv * cv))
        draws = np.exp(s * z - s * s / 2.0)
    maxima = draws.max(axis=1)
    predicted = straggler_slowdown(n, cv, distribution)
    assert predicted == pytest.approx(maxima.mean(), abs=4 * maxima.std() / math.sqrt(trials))


def test_expected_max_by_hand_and_asymptote():
    # the maximum of two standard normals has mean 1/sqrt(pi)
    assert straggler_slowdown(2, 0.1, "normal") == pytest.approx(1 + 0.1 / math.sqrt(math.pi))
    assert straggler_slowdown(1, 0.1) == 1.0 and straggler_slowdown(4096, 0.0) == 1.0
    # Gumbel's asymptote at a million: location b_n = sqrt(2 ln n) - (ln ln n + ln 4 pi) /
    # (2 sqrt(2 ln n)) plus Euler's gamma times the scale 1 / sqrt(2 ln n): 4.876
    n = 1e6
    root = math.sqrt(2 * math.log(n))
    location = root - (math.log(math.log(n)) + math.log(4 * math.pi)) / (2 * root)
    asymptote = location + 0.5772156649 / root
    assert (straggler_slowdown(n, 1.0, "normal") - 1.0) == pytest.approx(asymptote, rel=0.01)
    grow = straggler_slowdown(np.array([8, 64, 1024, 16384]), 0.015)
    assert np.all(np.diff(grow) > 0)


# ---------------------------------------------------------------- published checks


def test_llama3_interruptions_and_effective_training_time():
    """Llama 3 405B, 16,384 H100 for 54 days: 466 interruptions and higher than 90% effective
    training time (arXiv:2407.21783 section 3.3.4), from the h100-sxm preset's rates."""
    fm = failure_model("h100-sxm")
    gpus, days = LLAMA3["gpus"], LLAMA3["days"]
    expected = _per_day(job_rates(fm, gpus)) * days
    assert expected == pytest.approx(LLAMA3["interruptions"], rel=0.30)
    params = float(total_params(load_model("llama3-405b").spec))
    plan = failure_plan(
        fm,
        num_gpus=gpus,
        useful_s=days * DAY_S * 0.9,
        checkpoint_bytes=checkpoint_bytes(params, "bf16"),
    )
    assert plan.goodput == pytest.approx(LLAMA3["effective_training_time"], abs=0.03)
    assert plan.mtbf_hours == pytest.approx(24 * days / 419, rel=0.30)


def test_kokolis_mttf_against_job_size():
    """Kokolis et al. (arXiv:2410.21680) on A100: job MTTF falls about inversely with the GPUs;
    the a100-80gb preset's unplanned MTTF within 1.5x of their projections (16,384 and 131,072
    GPUs) and within 5x of their measured points (8 and 1,024 GPUs, which their own failure rate
    per node-day also overestimates by 3-4x)."""
    fm = failure_model("a100-80gb")
    sizes = np.array([8, 1024, 16384, 131072])
    mttf_h = 1.0 / np.asarray(job_rates(fm, sizes).unplanned_per_s) / 3600.0
    assert np.all(np.diff(mttf_h) < 0)
    slopes = np.diff(np.log(mttf_h)) / np.diff(np.log(sizes))
    assert np.all((slopes > -1.05) & (slopes < -0.95))
    published = np.array([KOKOLIS_MTTF_H[str(n)] for n in sizes])
    ratio = mttf_h / published
    assert np.all((ratio[2:] > 1 / 1.5) & (ratio[2:] < 1.5))
    assert np.all((ratio[:2] > 1 / 5) & (ratio[:2] < 5))


@pytest.mark.parametrize("hardware", ["a100-80gb", "h100-sxm"])
def test_hardware_failures_per_node_day_within_kokolis_clusters(hardware):
    fm = failure_model(hardware, planned=False)
    by = job_rates(fm, 8).by_component_per_s
    hardware_per_node_day = (sum(by.values()) - by["software"]) * DAY_S * 1000
    rsc = PROFILE["checks"]["kokolis_failures_per_1000_node_days"]
    assert rsc["rsc2"] < hardware_per_node_day < rsc["rsc1"]


def test_gpu_rates_against_bloom():
    # A100 GPU failures of every kind on BLOOM; Hopper's (Llama 3, Delta) within a factor 2
    bloom = PROFILE["checks"]["bloom_gpu_per_gpu_hour"]["value"]
    for name in ("a100-80gb", "h100-sxm"):
        r = failure_model(name).rates
        per_hour = (r.gpu_per_s + r.gpu_memory_per_s) * 3600
        assert 0.5 < per_hour / bloom < 2.0


# ---------------------------------------------------------------- behaviour


def test_goodput_falls_and_interruptions_grow_with_job_size():
    fm = failure_model("h100-sxm")
    gpus = np.array([512, 2048, 8192, 32768, 131072])
    params = float(total_params(load_model("llama3-405b").spec))
    plan = failure_plan(
        fm, num_gpus=gpus, useful_s=np.full(5, 1e7), checkpoint_bytes=checkpoint_bytes(params)
    )
    assert np.all(np.diff(plan.goodput) < 0)
    assert np.all(np.diff(plan.interruptions_per_day) > 0)
    assert np.all(np.diff(plan.straggler_slowdown) > 0)
    assert np.all(plan.wall_s > plan.useful_s)


def test_user_mtbf_scopes_and_planned_switch():
    job = failure_model("h100-sxm", mtbf_hours=10.0, planned=False)
    node = failure_model("h100-sxm", mtbf_hours=1000.0, mtbf_per="node")
    gpu = failure_model("h100-sxm", mtbf_hours=8000.0, mtbf_per="gpu")
    for n in (64, 4096):
        assert job_rates(job, n).unplanned_per_s == pytest.approx(1 / 36000.0)
        assert job_rates(job, n).planned_per_s == 0.0
        assert job_rates(node, n).unplanned_per_s == pytest.approx(n / 8 / 3.6e6)
        assert job_rates(gpu, n).unplanned_per_s == pytest.approx(n / 2.88e7)


def test_goodput_ranking_can_prefer_a_smaller_job():
    # a 4x bigger job at 3.6x the throughput: faster without failures, slower when every GPU
    # fails every 2,000 hours and each restart costs an hour
    hws = {"h100-sxm": load_hardware("h100-sxm")}
    df = pd.DataFrame(
        {
            "hardware": ["h100-sxm", "h100-sxm"],
            "num_gpus": [16384, 4096],
            "tokens_per_s": [3.6e6, 1.0e6],
            "params": [405e9, 405e9],
            "dtype": ["bf16", "bf16"],
            "step_time_s": [4.0, 16.0],
        }
    )
    harsh = failure_model("h100-sxm", mtbf_hours=2000.0, mtbf_per="gpu", restart_overhead_s=3600.0)
    assert list(goodput_order(df, hws, harsh, "time")) == [1, 0]
    assert list(goodput_order(df, hws, failure_model("h100-sxm"), "time")) == [0, 1]
    assert list(goodput_order(df, hws, lambda hw: harsh, "cost")) == [1, 0]


def test_train_days_bounds_add_in_log_space():
    lo, hi = train_days_bounds(100.0, failure_sd_log=0.03)
    assert (lo, hi) == pytest.approx(
        (100 * math.exp(-1.644854 * 0.03), 100 * math.exp(1.644854 * 0.03))
    )
    lo, hi = train_days_bounds(100.0, step_sd_log=0.03, failure_sd_log=0.04, level=0.5, dof=5)
    q = 0.726687  # Student-t, 5 degrees of freedom, 75th percentile
    assert hi == pytest.approx(100 * math.exp(q * 0.05), rel=1e-5)


# ---------------------------------------------------------------- planning


# plans without failures: the contract's formulas (perfmodel/plan/training.py) evaluated here in
# the same order, so "as without a failure model" holds to the bit; the last case adds a host
# share (h100-sxm: 10.2 kW DGX H100 over 8 GPUs = 1,275 W, 575 W beyond the 700 W board)
PLANS = [
    dict(tokens=15e12, tokens_per_s=2.7e6, num_gpus=16384, price_per_gpu_hour_usd=2.99,
         board_power_w=700.0),
    dict(tokens=3e11, tokens_per_s=123456.789, num_gpus=16, price_per_gpu_hour_usd=None,
         board_power_w=400.0, utilisation_factor=0.5, pue=1.2),
    dict(tokens=1e9, tokens_per_s=1e3, num_gpus=8, price_per_gpu_hour_usd=math.nan),
    dict(tokens=15e12, tokens_per_s=2.7e6, num_gpus=16384, price_per_gpu_hour_usd=2.99,
         board_power_w=700.0, host_power_w=575.0),
]  # fmt: skip
PLAN_KEYS = ["tokens", "train_days", "gpu_hours", "cost_usd", "energy_mwh",
             "price_per_gpu_hour_usd", "board_power_w", "utilisation_factor", "pue",
             "host_power_w"]  # fmt: skip


def _known(x):
    return None if x is None or math.isnan(x) else float(x)


def _plan_by_hand(
    tokens,
    tokens_per_s,
    num_gpus,
    price_per_gpu_hour_usd=None,
    board_power_w=None,
    utilisation_factor=0.76,
    pue=1.58,
    host_power_w=None,
):
    """wall = tokens / tokens_per_s; gpu-hours = gpus·wall / 3600; cost = gpu-hours·price;
    energy = gpus·(board + host)·utilisation·PUE·wall / 3.6e9 MWh (None without a board power,
    the boards alone without a host power); 0.76 and 1.58 are profiles/planning.json's."""
    wall_s = tokens / tokens_per_s
    gpu_hours = float(num_gpus) * wall_s / 3600.0
    price, board, host = (_known(x) for x in (price_per_gpu_hour_usd, board_power_w, host_power_w))
    node = None if board is None else board + (host or 0.0)
    energy = None if node is None else num_gpus * node * utilisation_factor * pue * wall_s / 3.6e9
    return {
        "tokens": float(tokens),
        "train_days": wall_s / DAY_S,
        "gpu_hours": gpu_hours,
        "cost_usd": None if price is None else gpu_hours * price,
        "energy_mwh": energy,
        "price_per_gpu_hour_usd": price,
        "board_power_w": board,
        "utilisation_factor": utilisation_factor,
        "pue": pue,
        "host_power_w": host,
    }


@pytest.mark.parametrize("kwargs", PLANS)
def test_failures_off_is_bit_for_bit(kwargs):
    doc = plan_training(**kwargs, failures=None).to_dict()
    want = _plan_by_hand(**kwargs)
    assert list(doc) == PLAN_KEYS  # no failures key
    assert all(doc[k] == v and type(doc[k]) is type(v) for k, v in want.items()), (doc, want)
    assert plan_training(**kwargs).to_dict() == doc  # failures off is the default


def test_failures_off_plan_for_and_frame_are_bit_for_bit():
    hw = load_hardware("h100-sxm")
    # the preset's host share: a DGX H100's 10.2 kW over 8 GPUs, less the 700 W board
    assert hw.board_power_w == 700.0 and hw.host_power_w == 10200.0 / 8 - 700.0 == 575.0
    doc = plan_for({"tokens_per_s": 2.5e6, "num_gpus": 1024}, hw, 2e12).to_dict()
    assert doc == _plan_by_hand(
        2e12, 2.5e6, 1024.0, float(hw.spec.price_per_device_hour_usd), 700.0, host_power_w=575.0
    )
    df = pd.DataFrame(
        {
            "hardware": ["h100-sxm", "a100-80gb", "cpu-host"],
            "num_gpus": [1024, 64, 8],
            "tokens_per_s": [2.5e6, 3.3e4, 10.0],
        }
    )
    hws = {n: load_hardware(n) for n in df.hardware}
    out = plan_frame(df, hws, 1e12)
    assert list(out.columns) == [*df.columns, "train_days", "gpu_hours", "cost_usd", "energy_mwh"]
    # the vectorised frame is plan_for row by row, to the bit (no board power: NaN, not None)
    for i, row in enumerate(df.to_dict("records")):
        one = plan_for(row, hws[row["hardware"]], 1e12).to_dict()
        for k in ("train_days", "gpu_hours", "cost_usd"):
            assert out[k].iloc[i] == one[k], (row["hardware"], k)
        energy = out["energy_mwh"].iloc[i]
        assert (math.isnan(energy) and one["energy_mwh"] is None) or energy == one["energy_mwh"]
    assert hws["cpu-host"].board_power_w is None and math.isnan(out["energy_mwh"].iloc[2])


def test_failures_on_plan_includes_overheads():
    fm = failure_model("h100-sxm")
    kw = dict(tokens=15e12, tokens_per_s=2.7e6, num_gpus=16384, price_per_gpu_hour_usd=2.0,
              board_power_w=700.0)  # fmt: skip
    off = plan_training(**kw)
    on = plan_training(**kw, failures=fm, checkpoint_bytes=5.7e12, step_time_s=6.0)
    f = on.failures
    for key in ("interruptions_per_day", "checkpoint_interval_s", "checkpoint_write_s",
                "goodput", "straggler_slowdown", "train_days_sd"):  # fmt: skip
        assert key in f and f[key] > 0
    wall = f["wall_s"]
    assert on.train_days == wall / DAY_S
    assert on.gpu_hours == pytest.approx(16384 * wall / 3600)
    assert on.cost_usd == pytest.approx(2.0 * on.gpu_hours)
    assert on.energy_mwh / off.energy_mwh == pytest.approx(on.train_days / off.train_days)
    assert on.train_days == pytest.approx(
        off.train_days * f["straggler_slowdown"] / f["goodput"], rel=1e-12
    )
    with pytest.raises(AisimError) as e:
        plan_training(**kw, failures=fm)
    assert e.value.field == "checkpoint_bytes"


def test_plan_for_an_estimate_with_failures():
    est = estimate("gpt3-125m", "h100-sxm", num_gpus=8, global_batch=16, tp=1, pp=1)
    doc = est.to_dict()
    plan = plan_for(doc, est.hardware, 1e10, failures=lambda hw: failure_model(hw)).to_dict()
    assert plan["failures"]["checkpoint_bytes"] == doc["params"] * 14
    assert plan["train_days"] > 1e10 / doc["tokens_per_s"] / DAY_S


# ---------------------------------------------------------------- the profile


def test_every_preset_has_cited_rates_and_tiers():
    assert set(hardware_names()) <= set(PROFILE["hardware"])
    sources = set(PROFILE["sources"]) | {"none"}
    estimates = [e for fam in PROFILE["families"].values() for k, v in fam.items() if k != "note"
                 for e in v]  # fmt: skip
    estimates += [e for k, v in PROFILE["fleet"].items() if k != "note" for e in v]
    assert all(e["source"] in sources and e["note"] for e in estimates)
    for name in storage_names():
        assert PROFILE["storage"][name]["source"]
    assert pooled_rate([{"value": 1e-6}, {"value": 4e-6}]) == pytest.approx(2e-6)
    assert pooled_rate([{"value": 0.0}, {"value": 4e-6}]) == 0.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(storage="tape"), "storage"),
        (dict(mtbf_hours=-1.0), "mtbf_hours"),
        (dict(mtbf_per="rack"), "mtbf_per"),
        (dict(interval_rule="guess"), "interval_rule"),
        (dict(checkpoint_interval_s=0.0), "checkpoint_interval_s"),
        (dict(straggler_cv=math.nan), "straggler_cv"),
        (dict(straggler_distribution="cauchy"), "straggler_distribution"),
        (dict(hardware="tpu-v9"), "hardware"),
    ],
)
def test_bad_options_name_their_field(kwargs, field):
    with pytest.raises(AisimError) as e:
        failure_model(**({"hardware": "h100-sxm"} | kwargs))
    assert e.value.field == field


def test_hardware_without_an_entry_gets_hopper_rates_and_its_own_memory():
    import dataclasses

    hw = dataclasses.replace(load_hardware("h100-sxm"), name="my-gpu")
    fm = failure_model(hw)
    h100 = failure_model("h100-sxm")
    assert fm.hardware == "default" and fm.rates.gpu_per_s == h100.rates.gpu_per_s
    # 80 GiB of the file is 85.9 GB
    assert fm.rates.gpu_memory_per_s == pytest.approx(
        h100.rates.gpu_memory_per_s * 85.899 / 80, rel=1e-4
    )


def test_plan_sweep_ranks_by_time_with_failures():
    kw = dict(tokens=3e11, num_gpus=[8, 64], global_batch=[64], top=4, rank_by="time")
    on = plan_sweep(
        "gpt3-125m", "h100-sxm", failures=lambda hw: failure_model(hw), keep_all=True, **kw
    )
    days = [r["train_days"] for r in on.top]
    assert days == sorted(days)
    assert days[0] == pytest.approx(on.all_feasible["train_days"].min(), rel=1e-9)
    assert all(0 < r["failures"]["goodput"] < 1 for r in on.top)
    assert (on.all_feasible["straggler_slowdown"] > 1).all()
    off = plan_sweep("gpt3-125m", "h100-sxm", **kw)
    assert all("failures" not in r for r in off.top)
    assert on.top[0]["train_days"] > min(r["train_days"] for r in off.top)
