"""Shared pieces: cleaning launcher prefixes, tqdm bars and colours; warm-up and averaging."""

import pytest

from calibration.logs.rows import Sample, clean_lines, drop_warmup, summarise
from simbase.errors import AisimError


def test_clean_lines_prefixes_colours_and_tqdm():
    text = (
        "[rank3]:iteration 1\n"
        "[default0]:x\n"
        "12: srun label\n"
        "worker-1: [2024-05-01 10:00:00,000] [INFO] pdsh\n"
        "10.0.0.2: host by address\n"
        "\x1b[31mstep:  1\x1b[39m\n"
        "2024-05-01T10:00:00.123456789Z [rank2]:collector stamp\n"
        "\rStep:  20%|██        | 1/5 [00:22<01:31, 22.90s/it][08/30/23 07:07:54] INFO  msg\n"
    )
    got = [(ln.no, ln.rank, ln.text) for ln in clean_lines(text)]
    assert got == [
        (1, "3", "iteration 1"),
        (2, "0", "x"),
        (3, "12", "srun label"),
        (4, "worker-1", "[2024-05-01 10:00:00,000] [INFO] pdsh"),
        (5, "10.0.0.2", "host by address"),
        (6, None, "step:  1"),
        (7, "2", "collector stamp"),
        (8, None, "[08/30/23 07:07:54] INFO  msg"),
    ]


def _samples(values, steps=10):
    return [Sample(i, (i + 1) * steps, v, steps) for i, v in enumerate(values)]


def test_default_warmup_is_ten_percent_at_least_one():
    assert drop_warmup(_samples([9.0] * 5), None)[1] == 1
    assert drop_warmup(_samples([9.0] * 11), None)[1] == 2
    kept, dropped = drop_warmup(_samples([5.0, 1.0, 2.0, 3.0]), skip_iterations=10)
    assert [s.step_time_s for s in kept] == [1.0, 2.0, 3.0] and dropped == 1


def test_summarise_weights_by_steps_and_skips_bad():
    kept = [Sample(1, 1, 4.0, 1), Sample(2, 10, 1.0, 9), Sample(3, 20, 9.0, 10, ok=False),
            Sample(4, 30, float("nan"), 10)]  # fmt: skip
    t = summarise(kept, 0, "x.log")
    assert t.step_time_s == pytest.approx((4.0 + 9 * 1.0) / 10)
    assert t.step_time_std_s == pytest.approx(((4.0 - 2.5) ** 2 + (1.0 - 2.5) ** 2) ** 0.5)
    assert (t.iterations_averaged, t.lines_used, t.bad_lines) == (10, 2, 2)


def test_nothing_left_after_warmup_names_skip_iterations():
    with pytest.raises(AisimError) as e:
        summarise([], 1, "x.log")
    assert e.value.field == "skip_iterations" and e.value.source == "x.log"
