"""Colossal-AI log import: the three result formats, command lines and overrides (the command
line's `aisim calibrate import-colossal`: tests/aisim/test_calibrate_import_colossal.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration import measurements as meas
from calibration.colossal import import_logs, parse_command, parse_log
from simbase.errors import AisimError

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def presets(monkeypatch):
    names = {"model": ["gpt2", "llama2-7b", "llama2-13b", "llama2-70b"],
             "hardware": ["h100-sxm", "h200", "a100-40gb"]}  # fmt: skip
    monkeypatch.setattr(meas, "_preset_names", lambda kind: names[kind])


def test_current_format_3d_plugin():
    df = import_logs([FIX / "llama2_7b_3d_tp2_pp2.log"], {"hardware": "h100-sxm"})
    r = df.iloc[0]
    assert (r["model"], r["plugin"], r["num_gpus"], r["dp"], r["tp"], r["pp"]) == (
        "llama2-7b", "3d", 8, 2, 2, 2)  # fmt: skip
    assert (r["zero_stage"], r["global_batch_size"], r["batch_size_per_dp"]) == (1, 32, 16)
    assert (r["micro_batch_size"], r["num_microbatches"], r["seq_len"]) == (2, 8, 4096)
    assert (r["recompute"], r["dtype"], r["hardware"]) == ("full", "bf16", "h100-sxm")
    assert r["throughput_samples_per_s"] == 4.10
    assert r["tflops_per_gpu_megatron"] == 127.87 and r["tflops_per_gpu"] == 113.16
    assert r["peak_mem_mib"] == 41022.18
    assert r["num_params"] == round(6.28 * 1024**3)  # Colossal-AI's binary 'B'
    assert r["measured_step_time_s"] == pytest.approx(32 / 4.10)
    assert r["log_format"] == "current" and r["has_measurement"]


def test_older_format_gemini_with_script_defaults():
    df = import_logs([FIX / "llama2_13b_gemini_older.log"])
    r = df.iloc[0]
    assert r["log_format"] == "older"
    assert (r["model"], r["plugin"], r["zero_stage"], r["dp"], r["pp"]) == (
        "llama2-13b", "gemini", 3, 8, 1)  # fmt: skip
    assert (r["global_batch_size"], r["seq_len"], r["recompute"]) == (64, 2048, "none")
    assert r["tflops_per_gpu"] == 142.18 and "not divided" in r["flop_convention"]
    assert r["measured_step_time_s"] == pytest.approx(64 / 7.11)


def test_legacy_trainer_needs_model_from_overrides():
    df = import_logs([FIX / "gpt2_legacy_trainer.log"], {"model": "gpt2", "hardware": "a100-40gb"})
    r = df.iloc[0]
    assert r["log_format"] == "legacy"
    assert (r["dp"], r["pp"], r["tp"], r["num_gpus"]) == (2, 2, 1, 4)
    assert r["global_batch_size"] == 32
    assert r["throughput_samples_per_s"] == 9.6924  # the last epoch's summary
    assert r["measured_step_time_s"] == 3.3016  # the Train-step timer wins over throughput
    assert r["model"] == "gpt2"


def test_sweep_log_splits_runs_and_skips_unfinished():
    df = import_logs([FIX / "sweep_two_runs.log"])
    assert df["source_row"].tolist() == [1, 3]
    assert df["global_batch_size"].tolist() == [16, 24]
    assert df["recompute"].tolist() == ["none", "full"]
    assert any("run 2: no result line" in m for m in df.attrs["skipped"])


def test_overrides_win_over_the_log():
    df = import_logs([FIX / "llama2_7b_3d_tp2_pp2.log"], {"batch_size": 8, "num_gpus": 16})
    r = df.iloc[0]
    assert (r["num_gpus"], r["dp"], r["global_batch_size"]) == (16, 4, 32)


def test_parse_command_forms():
    c = parse_command("torchrun --standalone --nproc-per-node=4 --nnodes 2 benchmark.py "
                      "--plugin 3d --tp 4 -b 8 -g --pp_style interleaved --n_chunks 2")  # fmt: skip
    assert (c["nproc_per_node"], c["nnodes"], c["plugin"], c["tp"], c["batch_size"]) == (
        4, 2, "3d", 4, 8)  # fmt: skip
    assert c["grad_checkpoint"] is True and c["n_chunks"] == 2


def test_hostfile_without_world_size_is_a_clear_error(tmp_path):
    log = tmp_path / "multi.log"
    log.write_text("colossalai run --nproc_per_node 8 --hostfile hosts benchmark.py -c 70b -b 4\n"
                   "Throughput: 3.27 samples/sec, TFLOPS per GPU by Megatron: 470.1, "
                   "TFLOPS per GPU: 469.10\n")  # fmt: skip
    with pytest.raises(AisimError, match="uses --hostfile") as e:
        import_logs([log])
    # the library names its argument; the CLI names the flag (test_cli_hint_names_the_flag)
    assert e.value.source == f"{log}: run 1" and e.value.field == "num_gpus"
    assert e.value.hint == "pass {num_gpus} (or {nnodes})"
    assert str(e.value).endswith("; pass num_gpus (or nnodes)")
    df = import_logs([log], {"nnodes": 2, "hardware": "h200"})
    assert df["num_gpus"].tolist() == [16] and df["global_batch_size"].tolist() == [64]


def test_log_without_results_and_unknown_override(tmp_path):
    log = tmp_path / "empty.log"
    log.write_text("colossalai run --nproc_per_node 8 benchmark.py\nCUDA out of memory\n")
    with pytest.raises(AisimError, match="no Colossal-AI result line"):
        import_logs([log])
    with pytest.raises(AisimError, match="unknown Colossal-AI override"):
        parse_log("", overrides={"tensor": 2})


def test_inconsistent_run_is_validated(tmp_path):
    log = tmp_path / "bad.log"
    log.write_text("colossalai run --nproc_per_node 6 benchmark.py -p 3d --tp 4 -b 2\n"
                   "Throughput: 1.00 samples/sec, TFLOPS per GPU: 1.0\n")  # fmt: skip
    with pytest.raises(AisimError, match=r"bad\.log:1: field 'tp' = 4"):
        import_logs([log])
