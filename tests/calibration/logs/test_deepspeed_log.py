"""DeepSpeed logs: config print, throughput timer on every rank, overflow, FLOPS profiler."""

import re

import pytest

from calibration.logs import import_logs

LOG = "deepspeed_zero2_bf16_8gpu.log"


def test_step_time_from_timer_lines(fixture_path):
    text = fixture_path(LOG).read_text()
    # The first printed CurrSamplesPerSec of each global step (ranks 1 and 2 print theirs too).
    curr = {}
    for m in re.finditer(
        r"global_step=(\d+), RunningAvgSamplesPerSec=\S+ CurrSamplesPerSec=([\d.]+)", text
    ):
        curr.setdefault(int(m.group(1)), float(m.group(2)))
    assert sorted(curr) == [10, 20, 30, 40, 50, 60, 70, 80]
    # Warm-up: the first of 8 lines (step 10); step 40 follows an fp16 OVERFLOW line.
    kept = [64 / curr[s] for s in (20, 30, 50, 60, 70, 80)]
    (row,) = import_logs([fixture_path(LOG)], overrides={"model": "gpt3-1.3b"}).to_dict("records")
    assert row["step_time_s"] == pytest.approx(sum(kept) / len(kept))
    assert row["step_time_s"] == pytest.approx(0.7975)  # the times the fixture was written with
    assert row["iterations_averaged"] == 6
    assert row["bad_lines_skipped"] == 1


def test_configuration(fixture_path):
    (row,) = import_logs([fixture_path(LOG)], overrides={"model": "gpt3-1.3b"}).to_dict("records")
    expected = dict(num_gpus=8, dp=8, tp=1, pp=1, global_batch_size=64, micro_batch_size=4,
                    zero_stage=2, dtype="bf16", tflops_per_gpu=82.88)  # fmt: skip
    for key, value in expected.items():
        assert row[key] == value, key
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert prov["model"] == "option" and prov["tp"] == "default"
    lines = fixture_path(LOG).read_text().splitlines()
    assert "dist_world_size=8" in lines[int(prov["num_gpus"][1:]) - 1]
    assert "zero_optimization_stage" in lines[int(prov["zero_stage"][1:]) - 1]


def test_old_timer_running_average_is_differenced(tmp_path):
    # DeepSpeed < 0.7: "E/S, SamplesPerSec=A" every 10 micro-steps, A = mbs·dp·(N-2)/T(N) with
    # T the time since micro-step 2. mbs 4, dp 8, 2 micro-steps per step: 64 samples per step.
    micro_s = {10: 0.4, 20: 0.5, 30: 0.45, 40: 0.42}  # seconds per micro-step in (N-10, N]
    t, prev, lines = 0.0, 2, []
    for n, dt in micro_s.items():
        t += (n - prev) * dt
        prev = n
        avg = 32 * (n - 2) / t
        head = "[2021-06-01 10:00:00,000] [INFO] [timer.py:166:stop]"
        lines.append(
            f"{head} 0/{n}, SamplesPerSec={avg!r}, MemAllocated=3.1GB, MaxMemAllocated=9.8GB"
        )
    log = tmp_path / "old.log"
    log.write_text(
        "[2021-06-01 09:59:00,000] [INFO] [launch.py:113:main] dist_world_size=8\n"
        "[2021-06-01 09:59:10,000] [INFO] [config.py:904:print] DeepSpeedEngine configuration:\n"
        "[2021-06-01 09:59:10,000] [INFO] [config.py:908:print]   gradient_accumulation_steps "
        ".. 2\n"
        "[2021-06-01 09:59:10,000] [INFO] [config.py:908:print]   train_batch_size ............. "
        "64\n" + "\n".join(lines) + "\n"
    )
    (row,) = import_logs([log], overrides={"model": "gpt3-1.3b"}).to_dict("records")
    # Warm-up: the first line. Then steps of 2 micro-steps: 1.0, 0.9, 0.84 s, 5 steps each.
    assert row["step_time_s"] == pytest.approx((1.0 + 0.9 + 0.84) / 3)
    assert row["iterations_averaged"] == 15 and row["format"] == "deepspeed"
