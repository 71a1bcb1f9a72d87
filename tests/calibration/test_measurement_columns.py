"""The measurement schema's columns for the parallel degrees, memory plan and stack (cp, ep, etp,
shard_size, fp8, recompute_layers, tp_overlap) and the MoE model columns map to the strategy
and the model, and a Megatron log's arguments fill them. That the shipped public runs map the
same way through this schema as through their own loader is checked in test_public_runs.py,
whose process has read those runs already (reading them compiles a memory check per shape)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibration.logs import import_logs
from calibration.measurements import load_measurements
from calibration.rows import resolve_rows, row_strategy
from perfmodel.specs.choices import Dtype
from perfmodel.specs.strategy import leaves_of
from simbase.errors import AisimError

FIXTURES = Path(__file__).parent / "logs" / "fixtures"
HEADER = "model,hardware,num_gpus,tp,pp,cp,ep,etp,zero_stage,shard_size,fp8,dtype,"
HEADER += "recompute,recompute_layers,tp_overlap,global_batch_size,step_time_s\n"


def _strategies(tmp_path, text: str):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    df = load_measurements(path, purpose="fit")
    return df, [row_strategy(rc) for rc in resolve_rows(df)]


def test_cp_ep_fp8_row_maps_to_its_strategy(tmp_path):
    text = HEADER + "mixtral-8x7b,h100-sxm,64,2,4,2,4,1,3,4,tensorwise,bf16,full,2,yes,64,5.0\n"
    df, (s,) = _strategies(tmp_path, text)
    assert int(df["dp"].iloc[0]) == 4  # 64 / (tp 2 · pp 4 · cp 2)
    v = leaves_of(s)
    got = {k: float(v[k]) for k in ("dp", "tp", "pp", "cp", "ep", "etp")}
    assert got == {"dp": 4, "tp": 2, "pp": 4, "cp": 2, "ep": 4, "etp": 1}
    assert int(v["dtype"]) == Dtype.FP8  # the fp8 recipe column turns the bf16 run's GEMMs to FP8
    assert float(v["shard_size"]) == 4 and float(v["zero_stage"]) == 3
    assert float(v["recompute_layers"]) == 2 and s.stack.tp_overlap is True


def test_absent_or_blank_columns_are_the_defaults(tmp_path):
    text = "model,hardware,num_gpus,tp,pp,global_batch_size,step_time_s\n"
    text += "llama3-8b,h100-sxm,8,2,1,16,1.0\n"
    _, (s,) = _strategies(tmp_path, text)
    v = leaves_of(s)
    assert (float(v["cp"]), float(v["ep"]), float(v["etp"]), float(v["shard_size"])) == (1, 1, 1, 0)
    assert int(v["dtype"]) == Dtype.BF16 and float(v["recompute_layers"]) == 0
    assert s.stack.tp_overlap is False
    blank = HEADER + "llama3-8b,h100-sxm,8,2,1,,,,,,,,,,,16,1.0\n"
    _, (b,) = _strategies(tmp_path, blank)
    w = leaves_of(b)
    assert (float(w["cp"]), float(w["ep"]), int(w["dtype"])) == (1, 1, Dtype.BF16)
    assert b.stack == s.stack


@pytest.mark.parametrize("word, fp8", [("yes", True), ("no", False), ("delayed", True)])
def test_fp8_column_is_a_switch_or_a_recipe(tmp_path, word, fp8):
    text = HEADER + f"llama3-8b,h100-sxm,8,1,1,,,,,,{word},bf16,,,,8,1.0\n"
    _, (s,) = _strategies(tmp_path, text)
    assert int(s.memory.dtype) == (Dtype.FP8 if fp8 else Dtype.BF16)


def test_fp8_no_with_dtype_fp8_names_the_cell(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "llama3-8b,h100-sxm,8,1,1,,,,,,no,fp8,,,,8,1.0\n")
    with pytest.raises(AisimError) as e:
        load_measurements(path, purpose="fit")
    assert "runs.csv:1: field 'fp8' = 'no'" in str(e.value)


def test_dp_inconsistent_with_cp_is_reported(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("model,hardware,num_gpus,dp,tp,pp,cp,global_batch_size,step_time_s\n"
                    "llama3-8b,h100-sxm,16,4,2,1,4,16,1.0\n")  # fmt: skip
    with pytest.raises(AisimError) as e:
        load_measurements(path, purpose="fit")
    assert "field 'dp' = 4: expected dp·tp·pp·cp = 4·2·1·4 = 32" in str(e.value)


def test_ep_on_a_dense_preset_names_the_row_and_column(tmp_path):
    text = HEADER + "llama3-8b,h100-sxm,8,1,1,1,2,,,,,bf16,,,,8,1.0\n"
    path = tmp_path / "runs.csv"
    path.write_text(text)
    rows = resolve_rows(load_measurements(path, purpose="fit"))
    with pytest.raises(AisimError) as e:
        row_strategy(rows[0])
    assert e.value.field == "ep" and "no experts" in e.value.expected
    assert e.value.source.endswith("runs.csv:1")


def test_moe_model_columns_describe_a_custom_model(tmp_path):
    text = "model,num_layers,hidden_size,num_heads,num_kv_heads,ffn_hidden_size,seq_len,"
    text += "num_experts,experts_per_token,moe_ffn_hidden_size,shared_experts,dense_layers,"
    text += "head_dim,hardware,num_gpus,ep,global_batch_size,step_time_s\n"
    text += "custom,8,1024,16,4,4096,2048,32,4,512,1,2,128,h100-sxm,16,8,32,2.0\n"
    path = tmp_path / "runs.csv"
    path.write_text(text)
    (rc,) = resolve_rows(load_measurements(path, purpose="fit"))
    m = rc.model.spec
    got = [float(getattr(m, k)) for k in ("num_experts", "experts_per_token",
           "moe_ffn_hidden_size", "shared_experts", "dense_layers", "head_dim")]  # fmt: skip
    assert got == [32, 4, 512, 1, 2, 128]
    assert float(row_strategy(rc).layout.ep) == 8


def test_megatron_log_arguments_fill_the_parallel_and_moe_columns(tmp_path):
    text = (FIXTURES / "megatron_gpt_tp2_pp2.log").read_text()
    for old, new in (
        ("context_parallel_size ........................... 1",
         "context_parallel_size ........................... 2"),
        ("expert_model_parallel_size ...................... 1",
         "expert_model_parallel_size ...................... 2\n"
         "[rank0]:  expert_tensor_parallel_size ..................... 1\n"
         "[rank0]:  moe_ffn_hidden_size ............................. 1408\n"
         "[rank0]:  recompute_method ................................ block\n"
         "[rank0]:  recompute_num_layers ............................ 3"),
        ("num_experts ..................................... None",
         "num_experts ..................................... 8"),
        ("fp8 ............................................. None",
         "fp8 ............................................. e4m3"),
        ("recompute_granularity ........................... selective",
         "recompute_granularity ........................... full"),
        ("world_size ...................................... 8",
         "world_size ...................................... 16"),
    ):  # fmt: skip
        assert old in text
        text = text.replace(old, new)
    text = text.replace("using world size: 8,", "using world size: 16,")
    path = tmp_path / "moe_cp2.log"
    path.write_text(text)
    df = import_logs([path])
    row = df.iloc[0]
    expected = dict(cp=2, ep=2, etp=1, num_experts=8, experts_per_token=2,
                    moe_ffn_hidden_size=1408, recompute="full", recompute_layers=3,
                    dtype="fp8", fp8=True, num_gpus=16, dp=2)  # fmt: skip
    for key, value in expected.items():
        assert row[key] == value, key
