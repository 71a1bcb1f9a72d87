"""torchtitan logs: colours, every rank printing, NaN loss, restart, TOML job config."""

import pytest

from calibration.logs import import_logs, torchtitan

LOG = "torchtitan_llama3_8b_fsdp4_tp2.log"
# tps (tokens/s per device) on rank 0 by step, as the fixture prints them; rank 1's differ.
# First run: steps 1, 10, 20, 30, 40 (loss NaN), 50; after the restart at step 51: 60, 70, 80.
TPS = {1: 1021, 10: 4000, 20: 4096, 30: 4050, 50: 4064, 60: 4100, 70: 4090, 80: 4070}
GBS, SEQ, GPUS = 8, 8192, 8  # global batch, sequence length, pp·dp_shard·tp = 1·4·2


def step_time(tps):
    # tps = (tokens of one data-parallel rank) / (time · cp·tp·pp) -> time = gbs·seq/(tps·gpus)
    return GBS * SEQ / (tps * GPUS)


def test_step_time_from_tps(fixture_path):
    (row,) = import_logs([fixture_path(LOG)]).to_dict("records")
    # Warm-up: first line of each stretch (steps 1 and 60). Step 40 has a NaN loss.
    # Step 10 covers steps 2..10 (step 1 was logged on its own); the others cover 10 steps.
    kept = {10: 9, 20: 10, 30: 10, 50: 10, 70: 10, 80: 10}
    total = sum(kept.values())
    mean = sum(step_time(TPS[s]) * n for s, n in kept.items()) / total
    assert row["step_time_s"] == pytest.approx(mean)
    assert row["iterations_averaged"] == total
    values = [step_time(TPS[s]) for s in kept]
    m = sum(values) / len(values)
    std = (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    assert row["step_time_std_s"] == pytest.approx(std)
    assert row["bad_lines_skipped"] == 1 and row["warmup_lines_skipped"] == 2


def test_configuration(fixture_path):
    (row,) = import_logs([fixture_path(LOG)]).to_dict("records")
    expected = dict(
        model="llama3-8b", num_gpus=8, tp=2, pp=1, dp=4, cp=1, dp_shard=4, zero_stage=3,
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, vocab_size=128256,
        ffn_hidden_size=14336, global_batch_size=8, micro_batch_size=2, seq_len=8192,
        recompute="selective", dtype="bf16", hardware="h100-sxm", format="torchtitan",
        fused_attention=True,  # torchtitan's SDPA: a fused kernel, not in the log
    )  # fmt: skip
    for key, value in expected.items():
        assert row[key] == value, key
    assert "tflops_per_gpu" in row and row["mfu_pct"] > 0


def test_ffn_hidden_size_llama3_formula():
    # Llama 3 8B: 4·4096 = 16384 -> int(2/3·16384) = 10922 -> ·1.3 = 14198 -> up to 1024s: 14336
    assert torchtitan.ffn_hidden_size(4096, 1024, 1.3) == 14336
    assert torchtitan.ffn_hidden_size(8192, 4096, 1.3) == 28672  # Llama 3 70B


def test_toml_job_config_fills_what_the_log_lacks(tmp_path):
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text(
        '[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 1\n'
        "seq_len = 8192\n\n[parallelism]\ndata_parallel_shard_degree = 4\n"
        "tensor_parallel_degree = 2\npipeline_parallel_degree = 1\n"
        "data_parallel_replicate_degree = 1\ncontext_parallel_degree = 1\n\n"
        '[activation_checkpoint]\nmode = "full"\n'
    )
    log = tmp_path / "run.log"
    log.write_text(
        "[titan] 2025-06-20 10:00:10,000 - root - INFO - step:  1  loss: 12.0  memory: 40.00GiB"
        "(50.00%)  tps: 1,000  tflops: 50.00  mfu: 5.00%\n"
        "[titan] 2025-06-20 10:00:20,000 - root - INFO - step: 10  loss: 11.0  memory: 40.00GiB"
        "(50.00%)  tps: 2,048  tflops: 100.00  mfu: 10.00%\n"
    )
    (row,) = import_logs([toml, log]).to_dict("records")
    # global batch = local 1 · dp 4 = 4; time = 4·8192/(2048·8) = 2 s
    assert row["step_time_s"] == pytest.approx(2.0)
    assert row["model"] == "llama3-8b" and row["recompute"] == "full"
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert prov["seq_len"] == str(toml) and prov["num_gpus"] == "derived"


def test_printed_job_config(tmp_path):
    # torchtitan 2024-2025 with --job.print_args: the whole config as a dict on one line.
    args = {
        "job": {"description": "Llama 3 8B training", "print_args": True},
        "model": {"name": "llama3", "flavor": "8B"},
        "metrics": {"log_freq": 5},
        "training": {"batch_size": 2, "seq_len": 4096, "data_parallel_replicate_degree": 1,
                     "data_parallel_shard_degree": -1, "tensor_parallel_degree": 2,
                     "pipeline_parallel_degree": 1, "context_parallel_degree": 1,
                     "mixed_precision_param": "bfloat16"},
        "activation_checkpoint": {"mode": "full", "selective_ac_option": "2"},
    }  # fmt: skip
    log = tmp_path / "run.log"
    log.write_text(
        f"[titan] 2025-01-10 10:00:00,000 - root - INFO - Running with args: {args!r}\n"
        "[titan] 2025-01-10 10:00:01,000 - root - INFO - Building 2-D device mesh with"
        " ['dp_shard', 'tp'], [4, 2]\n"
        "[titan] 2025-01-10 10:00:10,000 - root - INFO - step:  1  loss: 12.0  memory: 40.00GiB"
        "(50.00%)  tps: 1,000  mfu: 5.00%\n"
        "[titan] 2025-01-10 10:00:20,000 - root - INFO - step:  5  loss: 11.0  memory: 40.00GiB"
        "(50.00%)  tps: 2,048  mfu: 10.00%\n"
        "[titan] 2025-01-10 10:00:30,000 - root - INFO - step: 10  loss: 10.0  memory: 40.00GiB"
        "(50.00%)  tps: 1,024  mfu: 10.00%\n"
    )
    (row,) = import_logs([log]).to_dict("records")
    # dp_shard -1 in the config; the mesh line says 4: 8 GPUs, dp 4, global batch 2·4 = 8.
    assert (row["num_gpus"], row["dp"], row["global_batch_size"]) == (8, 4, 8)
    assert row["model"] == "llama3-8b" and row["recompute"] == "full" and row["dtype"] == "bf16"
    # Lines at 5 (steps 2..5) and 10 (6..10): 8·4096/(tps·8) s; warm-up: the step-1 line.
    t5, t10 = 8 * 4096 / (2048 * 8), 8 * 4096 / (1024 * 8)
    assert row["step_time_s"] == pytest.approx((4 * t5 + 5 * t10) / 9)
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert prov["seq_len"] == "L1" and prov["dp_shard"] == "L2"
