"""Megatron-LM logs: arguments block, iteration lines, ranks, wrapped lines, NaN, restarts."""

import re
import statistics

import pytest

from calibration.logs import import_logs, megatron

LOG = "megatron_gpt_tp2_pp2.log"
# elapsed time per iteration (ms) of each printed line, by start, as the fixture has them.
# Start 1: iterations 1 (first-iteration line), 10, 20, 30, 40 (1 skipped), 50 (wrapped),
# 60 (1 NaN), 70; rank 3's copy of iteration 20 (1600.0) must not count.
# Start 2 (restart from the checkpoint at 60): 61 (first-iteration line), 70, 80, 90, 100.
START1 = {1: 5123.4, 10: 1510.2, 20: 1500.0, 30: 1502.0, 50: 1498.0, 70: 1504.0}
START2 = {61: 4800.0, 70: 1520.0, 80: 1496.0, 90: 1500.0, 100: 1502.0}


def _row(path, **kw):
    df = import_logs([path], **kw)
    assert len(df) == 1
    return df.iloc[0]


def test_default_warmup_pools_restart_and_drops_bad_lines(fixture_path):
    row = _row(fixture_path(LOG))
    # Default warm-up: 10% of each start's lines, at least one: the first line of each start.
    # Left out: iteration 40 (skipped) and 60 (NaN); rank 3's line; every kept line covers 10.
    kept = [START1[i] for i in (10, 20, 30, 50, 70)] + [START2[i] for i in (70, 80, 90, 100)]
    assert row["step_time_s"] == pytest.approx(statistics.mean(kept) / 1000)
    assert row["step_time_std_s"] == pytest.approx(statistics.stdev(kept) / 1000)
    assert row["iterations_averaged"] == 10 * len(kept)
    assert row["warmup_lines_skipped"] == 2
    assert row["bad_lines_skipped"] == 2
    assert row["restarts_pooled"] == 2
    assert row["duplicate_rank_lines"] == 1
    assert row["format"] == "megatron"


def test_explicit_skip_iterations(fixture_path):
    row = _row(fixture_path(LOG), skip_iterations=20)
    # A line is kept when all the iterations it covers come after the first 20 of its start:
    # start 1 (from 0): 30, 50, 70 (40 and 60 are bad); start 2 (from 60): 90, 100.
    kept = [START1[30], START1[50], START1[70], START2[90], START2[100]]
    assert row["step_time_s"] == pytest.approx(statistics.mean(kept) / 1000)
    assert row["iterations_averaged"] == 50


def test_configuration_from_arguments_block(fixture_path):
    row = _row(fixture_path(LOG))
    expected = dict(
        model="custom", num_gpus=8, tp=2, pp=2, dp=2, cp=1, ep=1, num_layers=24,
        hidden_size=2048, num_heads=16, num_kv_heads=4, ffn_hidden_size=5632, seq_len=4096,
        vocab_size=50432, micro_batch_size=1, global_batch_size=32, num_microbatches=16,
        interleave=1, recompute="selective", sequence_parallel=True, dtype="bf16",
        zero_stage=1, num_experts=0, experts_per_token=2, swiglu=True,
    )  # fmt: skip
    for key, value in expected.items():
        assert row[key] == value, key
    tflops = [180.1, 181.3, 181.0, 181.5, 180.8, 178.9, 181.8, 181.3, 181.0]
    assert row["tflops_per_gpu"] == pytest.approx(statistics.mean(tflops))


def test_provenance_names_lines(fixture_path):
    row = _row(fixture_path(LOG))
    prov = dict(item.split("=") for item in row["provenance"].split(";"))
    lines = (fixture_path(LOG)).read_text().splitlines()
    tp_line = int(prov["tp"][1:])
    assert "tensor_model_parallel_size" in lines[tp_line - 1]
    assert "padded vocab" in lines[int(prov["vocab_size"][1:]) - 1]
    assert prov["dp"] == "derived"
    first, last = (int(x[1:]) for x in prov["step_time_s"].split("-"))
    assert "iteration       10/" in lines[first - 1]
    assert "iteration      100/" in lines[last - 1]
    assert row["source"].endswith(
        f":L{min(int(v[1:].split('-')[0]) for v in prov.values() if v.startswith('L'))}-L{last}"
    )


def _with_args(text: str, **args) -> str:
    """The fixture with these arguments printed in its blocks, Megatron's way (sorted names)."""
    lines = "".join(f"[rank0]:  {k} {'.' * (48 - len(k))} {v}\n" for k, v in args.items())
    return text.replace("[rank0]:  adam_beta1 ", lines + "[rank0]:  adam_beta1 ")


@pytest.mark.parametrize(
    "args, expected",
    [
        # NVIDIA's MoE recipes: the precision-aware optimizer with bf16 moments (remainders of
        # the bf16 weights as master), DeepEP, the 1F1B EP overlap, bf16 gradient reduction
        (
            dict(accumulate_allreduce_grads_in_fp32=False, exp_avg_dtype="torch.bfloat16",
                 main_params_dtype="torch.float32", moe_token_dispatcher_type="flex",
                 overlap_grad_reduce=False, overlap_moe_expert_parallel_comm=True,
                 store_param_remainders=True, use_precision_aware_optimizer=True),
            dict(grad_reduce_fp32="bf16", bf16_moments=True, param_remainders=True,
                 moe_dispatch="flex", dp_overlap=False, moe_overlap=True),
        ),
        # Megatron-Core's defaults print store_param_remainders True and fp32 moments: without
        # the precision-aware optimizer neither applies
        (
            dict(accumulate_allreduce_grads_in_fp32=True, exp_avg_dtype="torch.float32",
                 moe_token_dispatcher_type="alltoall", overlap_grad_reduce=True,
                 store_param_remainders=True, use_precision_aware_optimizer=False),
            dict(grad_reduce_fp32="fp32", bf16_moments=False, param_remainders=False,
                 moe_dispatch="alltoall", dp_overlap=True, moe_overlap=None),
        ),
    ],
)  # fmt: skip
def test_stack_behaviours_from_the_arguments_block(fixture_path, tmp_path, args, expected):
    text = fixture_path(LOG).read_text().replace("  accumulate_allreduce_grads_in_fp32 ", "  x ")
    text = text.replace("  overlap_grad_reduce ", "  y ")  # printed by the fixture: re-printed
    (row,) = megatron.parse(_with_args(text, **args), "m.log", {}, None)
    for key, value in expected.items():
        assert row.get(key) == value, (key, row.get(key))
    # a line of the block is the provenance of each
    assert row["provenance"].count("bf16_moments=L") == 1
    # and the measurement table holds them as the registry reads them
    (tmp_path / "moe.log").write_text(_with_args(text, **args))
    got = _row(tmp_path / "moe.log")
    assert bool(got["bf16_moments"]) == expected["bf16_moments"]
    assert got["moe_dispatch"] == expected["moe_dispatch"]


def test_wrapped_line_is_joined():
    text = (
        " iteration       10/     100 | consumed samples: 320 | elapsed time per it\n"
        "eration (ms): 1000.0 | global batch size:    32 | number of skipped iterations:   0 | nu\n"
        "mber of nan iterations:   0 |\n"
    )
    starts, _ = megatron.split_starts(text)
    assert [s.step_time_s for s in starts[0].samples] == [1.0]


def test_other_configuration_is_another_row(fixture_path):
    text = fixture_path(LOG).read_text()
    first, second = text.split("restarting from the last checkpoint\n", 1)
    second = re.sub(r"(tensor_model_parallel_size \.+ )2", r"\g<1>4", second)
    second = re.sub(r"(data_parallel_size \.+ )2", r"\g<1>1", second)
    rows = megatron.parse(first + second, "m.log", {}, None)
    assert [r["tp"] for r in rows] == [2, 4]
    assert rows[1]["dp"] == 1


def test_batch_size_rampup_lines_left_out():
    head = "------------------------ arguments ------------------------\n"
    head += "  global_batch_size ............................... 64\n"
    head += "  log_interval .................................... 10\n"
    head += "  world_size ...................................... 8\n"
    head += "  num_layers ...................................... 2\n"
    head += "  hidden_size ..................................... 64\n"
    head += "-------------------- end of arguments ---------------------\n"

    def line(i, ms, gbs):
        return (f" iteration {i:8d}/     100 | elapsed time per iteration (ms): {ms:.1f} |"
                f" global batch size: {gbs:5d} | number of skipped iterations:   0 |"
                f" number of nan iterations:   0 |\n")  # fmt: skip

    text = head + line(10, 900, 32) + line(20, 800, 32) + line(30, 1000, 64) + line(40, 1010, 64)
    (row,) = megatron.parse(text, "m.log", {}, skip_iterations=0)
    assert row["step_time_s"] == pytest.approx(1.005)
    assert row["bad_lines_skipped"] == 2


def _head(interval):
    return (
        "------------------------ arguments ------------------------\n"
        "  global_batch_size ............................... 8\n"
        f"  log_interval .................................... {interval}\n"
        "  world_size ...................................... 8\n"
        "  num_layers ...................................... 2\n"
        "  hidden_size ..................................... 64\n"
        "-------------------- end of arguments ---------------------\n"
    )


def _it(i, ms):
    return (
        f" iteration {i:8d}/     100 | elapsed time per iteration (ms): {ms:.1f} | global batch"
        " size:     8 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )


def test_restart_without_arguments_block_is_a_new_start():
    # The count goes back from 30 to 20: a new start, whose first line is warm-up again.
    text = _head(10) + _it(10, 900) + _it(20, 500) + _it(30, 520) + _it(20, 950) + _it(30, 510)
    (row,) = megatron.parse(text, "m.log", {}, None)
    assert row["step_time_s"] == pytest.approx((0.5 + 0.52 + 0.51) / 3)
    assert row["warmup_lines_skipped"] == 2 and row["iterations_averaged"] == 30


def test_log_interval_one_lines_cover_one_iteration():
    text = _head(1) + "".join(_it(i, 100 * i) for i in range(1, 6))
    (row,) = megatron.parse(text, "m.log", {}, None)
    assert row["iterations_averaged"] == 4  # lines 2..5, one iteration each
    assert row["step_time_s"] == pytest.approx(0.35)
