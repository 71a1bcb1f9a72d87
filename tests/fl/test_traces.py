"""Availability and speed traces (fl.traces): the loader, sampling under a trace, the generator."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from fl import round as rnd
from fl.systems import client_time_s, draw_systems
from fl.traces import HOUR_COLUMNS, generate_trace, load_trace, read_trace
from simbase.errors import AisimError


def _write(tmp_path, rows, name="trace.csv"):
    path = tmp_path / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def test_generator_is_deterministic_per_seed_and_diurnal():
    a, b, c = generate_trace(60, 3), generate_trace(60, 3), generate_trace(60, 4)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    p = a[list(HOUR_COLUMNS)].to_numpy()
    for row in p:  # one contiguous (cyclic) night window of 5..9 hours at the high chance
        night = row == row.max()
        assert 5 <= night.sum() <= 9
        assert np.sum(night != np.roll(night, 1)) == 2
    share = p.mean(axis=0)
    assert share.max() > 2 * share.min()  # the population's availability follows the day


def test_speed_factor_two_halves_compute_time(tmp_path):
    path = _write(tmp_path, {"client_id": range(6), "device": "phone", "speed_factor": [1, 2] * 3})
    base = draw_systems({"server": 1.0}, 6, np.random.default_rng(0))
    sys = load_trace(path, base)
    f = np.asarray(sys.flops_per_s)
    assert np.allclose(f[1::2], 2 * f[::2]) and np.allclose(f[::2], 2e10)  # phone preset
    t = [client_time_s(1e9, 1e6, 1e6, *(getattr(sys, n)[k] for n in (
        "flops_per_s", "downlink_bytes_per_s", "uplink_bytes_per_s", "latency_s",
        "serialize_bytes_per_s"))) for k in range(2)]  # fmt: skip
    assert float(t[1].compute_s) == pytest.approx(float(t[0].compute_s) / 2, rel=1e-6)
    assert float(t[1].comm_s) == pytest.approx(float(t[0].comm_s), rel=1e-6)


@pytest.mark.slow  # a cohort plan compiled for a trace
def test_rounds_sample_only_clients_available_at_their_start(tmp_path, build_factory):
    # clients 0-19 are available 00:00-12:00 UTC, clients 20-39 12:00-24:00
    hours = ["0-12"] * 20 + ["12-24"] * 20
    path = _write(tmp_path, {"client_id": range(40), "available_hours": hours})
    b = build_factory(trace=path, clients_per_round=10)
    plan = jax.jit(lambda s: rnd.plan_cohort(b.spec, s, b.inputs, b.hyper))
    for hour, allowed in ((3, range(20)), (15, range(20, 40))):
        for r in range(5):
            state = dataclasses.replace(
                b.init_state, round=jnp.int32(r), clock_s=jnp.float32(hour * 3600.0 + 17)
            )
            p = plan(state)
            ids = np.asarray(p.ids)[np.asarray(p.contacted)]
            assert len(ids) == 10 and set(ids.tolist()) <= set(allowed)


@pytest.mark.slow
def test_a_cohort_larger_than_the_available_clients_shrinks(tmp_path, build_factory):
    hours = ["0-24"] * 6 + [""] * 34  # only 6 clients are ever available
    path = _write(tmp_path, {"client_id": range(40), "available_hours": hours})
    b = build_factory(trace=path, clients_per_round=10)
    state, met = b.run_round(b.init_state, b.inputs, b.hyper)
    assert int(met.clients_sampled) == 6 and int(met.clients_kept) == 6


ASYNC = dict(
    algorithm="fedbuff", buffer_size=2, concurrency=4, clients_per_round=10, model="logreg",
    max_local_steps=2,
)  # fmt: skip


@pytest.mark.slow
def test_fedbuff_dispatches_only_available_clients(tmp_path, build_factory):
    hours = ["0-24"] * 10 + [""] * 30
    path = _write(tmp_path, {"client_id": range(40), "available_hours": hours})
    b = build_factory(trace=path, **ASYNC)
    state = b.init_state
    for _ in range(4):
        state, met = b.run_round(state, b.inputs, b.hyper)
        assert set(np.asarray(met.arrived_ids).tolist()) <= set(range(10))
        assert set(np.asarray(state.ids).tolist()) <= set(range(10))


@pytest.mark.slow
def test_fedbuff_waits_for_the_first_available_hour(tmp_path, build_factory):
    # nobody is available before 02:00 UTC: the first dispatches wait two hours
    path = _write(tmp_path, {"client_id": range(40), "available_hours": ["2-6"] * 40})
    b = build_factory(trace=path, **ASYNC)
    assert float(b.init_state.finish_s.min()) > 2 * 3600.0
    state, met = b.run_round(b.init_state, b.inputs, b.hyper)
    assert 2 * 3600.0 < float(state.clock_s) < 2 * 3600.0 + 60.0


@pytest.mark.parametrize(
    "rows, field",
    [
        ({"client_id": [0, 1, 1]}, "client_id"),
        ({"client_id": [0, 1, 2], "available_hours": ["0-5", "7-3", ""]}, "available_hours"),
        ({"client_id": [0, 1, 2], "speed_factor": [1, 0, 1]}, "speed_factor"),
        ({"client_id": [0, 1, 2], "device": ["phone", "toaster", "phone"]}, "device"),
        ({"client_id": [0, 1, 2], **{c: [0.5, 1.5, 0] for c in HOUR_COLUMNS}}, "p0"),
    ],
)
def test_bad_trace_names_file_and_column(tmp_path, rows, field):
    path = _write(tmp_path, rows)
    with pytest.raises(AisimError) as e:
        read_trace(path, 3)
    assert e.value.source == path and e.value.field == field
