"""Colossal-AI benchmark.py logs: the args: Namespace + Step time generation, and the older ones."""

import statistics

import pytest

from calibration.logs import colossal_bench, import_logs
from simbase.errors import AisimError

LOG = "colossal_llama2_13b_gemini_namespace.log"
STEP_TIMES = [22.885, 19.714, 19.532, 19.608, 19.571]


def test_missing_world_size_names_the_field(fixture_path):
    # The log of hpcaitech/ColossalAI#4551 does not say how many GPUs ran it.
    with pytest.raises(AisimError) as e:
        import_logs([fixture_path(LOG)])
    assert e.value.field == "num_gpus"
    assert e.value.source == str(fixture_path(LOG))
    assert e.value.hint == "pass {num_gpus}"
    assert e.value.render({"num_gpus": "--num-gpus"}).endswith("pass --num-gpus")


def test_step_times_after_the_scripts_own_warmup(fixture_path):
    (row,) = import_logs([fixture_path(LOG)], overrides={"num_gpus": 8}).to_dict("records")
    kept = STEP_TIMES[2:]  # ignore_steps=2 in the Namespace
    assert row["step_time_s"] == pytest.approx(statistics.mean(kept))
    assert row["step_time_std_s"] == pytest.approx(statistics.stdev(kept))
    assert row["iterations_averaged"] == 3
    expected = dict(model="llama2-13b", plugin="gemini", num_gpus=8, dp=8, tp=1, pp=1,
                    zero_stage=3, global_batch_size=64, seq_len=4096, recompute="full",
                    dtype="bf16", throughput_samples_per_s=3.27, format="colossal")  # fmt: skip
    for key, value in expected.items():
        assert row[key] == value, key
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert (
        prov["num_gpus"] == "option" and prov["model"] == "L1" and prov["zero_stage"] == "derived"
    )


def test_skip_iterations_wins_over_ignore_steps(fixture_path):
    (row,) = import_logs([fixture_path(LOG)], overrides={"num_gpus": 8}, skip_iterations=1).to_dict(
        "records"
    )
    assert row["step_time_s"] == pytest.approx(statistics.mean(STEP_TIMES[1:]))


def test_wrapped_namespace_is_joined():
    text = (
        "[08/30/23 07:07:30] INFO     colossalai - colossalai - INFO: args: "
        "Namespace(config='7b',\n"
        "                    INFO     plugin='3d', batch_size=4, tp=2, pp=1, max_length=2048)\n"
        "Step time: 2.0\nStep time: 1.0\nStep time: 1.5\n"
    )
    (row,) = colossal_bench.parse(text, "c.log", {"num_gpus": 4}, None)
    assert row["model"] == "llama2-7b" and row["tp"] == 2 and row["dp"] == 2
    assert row["global_batch_size"] == 8
    assert row["step_time_s"] == pytest.approx(1.25)  # default warm-up: the first step


def test_older_generation_goes_through_calibration_colossal():
    from pathlib import Path

    old = Path(__file__).parents[1] / "fixtures" / "llama2_7b_3d_tp2_pp2.log"
    df = import_logs([old])
    assert set(df["format"]) == {"colossal"}
    assert df.iloc[0]["throughput_samples_per_s"] > 0 and df.iloc[0]["provenance"]
