"""The planning reports of one run and of a grid (``aisim perf estimate`` / ``grid`` as library
calls) against the pieces they compose: the estimate, the plan, the intervals, the
elasticities; and the planning options checked before any work."""

from __future__ import annotations

import pytest

from perfmodel import estimate, load_hardware, load_model, load_stack, stack_constants
from perfmodel.plan.options import PlanOptions, plan_options
from perfmodel.plan.reports import estimate_document, plan_grid
from perfmodel.plan.sensitivity import elasticities
from perfmodel.plan.training import plan_sweep
from simbase.errors import AisimError

KNOBS = dict(num_gpus=16, tp=2, pp=1, global_batch_size=64)


def _setup(stack=None):
    m, hw = load_model("gpt3-1.3b"), load_hardware("a100-80gb")
    preset = load_stack(stack, hw)
    return m, hw, preset, stack_constants(preset, hw)


def test_estimate_document_is_the_estimate_with_its_constants_and_nothing_unasked():
    m, hw, _, cal = _setup()
    doc = estimate_document(m, hw, cal, KNOBS)
    est = estimate(m, hw, constants=cal.constants, **KNOBS).to_dict()
    assert doc["step_time_s"] == pytest.approx(est["step_time_s"])
    assert doc["constants"] == cal.to_dict() and cal.covariance is None
    assert "train_days" not in doc and "elasticities" not in doc and "step_time_s_lo" not in doc


@pytest.mark.slow  # compiles the step function and its Jacobian
def test_estimate_document_adds_the_plan_intervals_and_elasticities_when_asked():
    m, hw, preset, cal = _setup("megatron-core")
    assert cal.covariance is not None  # a fitted stack: the estimate gets intervals
    doc = estimate_document(m, hw, cal, KNOBS, stack=preset, tokens=1e11, sensitivity=True)
    assert doc["step_time_s_lo"] < doc["step_time_s"] < doc["step_time_s_hi"]
    assert doc["train_days"] == pytest.approx(1e11 / doc["tokens_per_s"] / 86400)
    assert doc["train_days_lo"] < doc["train_days"] < doc["train_days_hi"]
    est = estimate(m, hw, constants=cal.constants, stack=preset, **KNOBS)
    want = elasticities(m, hw, cal.constants, est.strategy, "aisim").to_dict()
    assert doc["elasticities"] == pytest.approx(want["elasticities"])
    assert doc["bound_by"] == want["bound_by"]


@pytest.mark.slow  # compiles two grid searches
def test_plan_grid_ranks_as_plan_sweep_and_studies_the_best_when_asked():
    m, hw, _, cal = _setup()
    grid = dict(num_gpus=[16], global_batch=[64], top=3)
    result = plan_grid([m], [hw], calibration_for=lambda _: cal, tokens=1e11, sensitivity=True,
                       **grid)  # fmt: skip
    plain = plan_sweep([m], [hw], tokens=1e11, constants=lambda _: cal.constants, **grid)
    assert [r["step_time_s"] for r in result.top] == pytest.approx(
        [r["step_time_s"] for r in plain.top]
    )
    assert result.best["train_days"] == pytest.approx(plain.best["train_days"])
    assert result.best["bound_by"] and result.best["elasticities"]
    assert "elasticities" not in result.top[1]


def test_plan_options_check_every_value_before_the_tokens():
    assert plan_options() == PlanOptions(None, None, None, None)
    p = plan_options("300B", 2.0, 0.8, 1.2)
    assert p.tokens == 3e11 and p.power() == dict(utilisation_factor=0.8, pue=1.2)
    for args, field in (
        (("lots",), "tokens"),
        ((None, -1.0), "price_per_gpu_hour_usd"),
        ((None, None, 0.0), "utilisation_factor"),
        (("lots", None, None, 0.9), "pue"),  # the options first, as the command line reports
    ):
        with pytest.raises(AisimError) as e:
            plan_options(*args)
        assert e.value.field == field


def test_the_tables_of_a_comparison_and_a_sensitivity_keep_their_documents_rows():
    from perfmodel.plan.compare import COMPARE_KEYS, compare_table
    from perfmodel.plan.sensitivity import elasticity_table

    row = {k: i for i, k in enumerate(COMPARE_KEYS)} | {"strategy": "dp8 tp1", "best": {}}
    t = compare_table({"hardware": [row, row | {"hardware": "b200"}]})
    assert list(t.columns) == [*COMPARE_KEYS, "strategy"] and t["hardware"].tolist() == [0, "b200"]
    e = elasticity_table({"elasticities": {"peak_tflops.bf16": -0.7, "kernel_overhead_s": 0.1}})
    assert e.values.tolist() == [["peak_tflops.bf16", -0.7], ["kernel_overhead_s", 0.1]]
