"""Measurement loading: aliases, normalisation, derived columns and row-level validation."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from calibration import measurements as meas
from calibration.measurements import (
    InvalidRows,
    data_path,
    load_measurements,
    normalise_measurements,
)
from calibration.rows import resolve_rows, row_strategy
from simbase.errors import AisimError

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
MODELS = ["gpt2", "gpt2-medium", "gpt2-large", "gpt3-175b", "megatron-22b", "turing-530b",
          "megatron-1t", "llama2-7b", "llama2-70b", "mlp-small"]  # fmt: skip
HARDWARE = ["a100-80gb", "a100-40gb", "h100-sxm", "h200", "b200", "v100-32gb", "cpu-host"]


@pytest.fixture
def presets(monkeypatch):
    """Fixed preset lists, so these tests do not depend on which preset files exist."""
    names = {"model": MODELS, "hardware": HARDWARE}
    monkeypatch.setattr(meas, "_preset_names", lambda kind: names[kind])


def write(tmp_path: Path, text: str, name: str = "m.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_korthikanti_loads_as_is(presets):
    df = load_measurements(data_path("korthikanti2022_table5_iteration_time.csv"))
    assert len(df) == 8
    assert list(df["model"].unique()) == ["megatron-22b", "gpt3-175b", "turing-530b", "megatron-1t"]
    assert set(df["hardware"]) == {"a100-80gb"}
    assert list(df["recompute"][:2]) == ["full", "selective"]
    assert list(df["sequence_parallel"][:2]) == [False, True]
    assert df["tp"].tolist() == [8] * 8
    assert df["pp"].tolist() == [1, 1, 8, 8, 35, 35, 64, 64]
    assert df["interleave"].tolist() == [1, 1, 3, 3, 3, 3, 1, 1]
    assert df["micro_batch_size"].tolist() == [4, 4, 1, 1, 1, 1, 1, 1]
    assert df["num_heads"].tolist()[0] == 64
    assert df["measured_step_time_s"].tolist() == [1.42, 1.10, 18.13, 13.75, 49.05, 37.83,
                                                   94.42, 71.49]  # fmt: skip
    assert df["has_measurement"].all()
    assert df["source_row"].tolist() == list(range(1, 9))
    assert df["params_billion"].tolist()[0] == 22  # unknown columns pass through (as numbers)
    assert "source_of_value" in df.columns


# sha256 of the files in the project's shared data (../shared/data), recorded when they were copied
SHARED_SHA256 = {
    "korthikanti2022_table5_iteration_time.csv": "4931e3c273b69db10703f18b7ee16702865ffdd387e9d475204515571e443d83",
    "seed_distir_vs_colossal.csv": "2dd8d1fdc959d6b1989c21644c67b7ccfe08a1c3cd40004b041eac5593d0e8a3",
    "seed_distir_simulation.csv": "4fa86e49727fabffb30e8747510dfcce261c208491a3822faadd95d8a3e2d6d4",
    "colossalai_readme_benchmark.csv": "0073efa0a708695c1cb424ea820e011822379b3a5403f3df81ed22ac617b62a2",
}


def test_shipped_copies_are_byte_identical():
    import hashlib

    for name, digest in SHARED_SHA256.items():
        assert hashlib.sha256(data_path(name).read_bytes()).hexdigest() == digest
        shared = SHARED / name
        if shared.exists():  # beside a developer's checkout and in CI
            assert data_path(name).read_bytes() == shared.read_bytes()


def test_distir_vs_colossal_loads_and_only_the_measured_row_is_fittable(presets):
    df = load_measurements(data_path("seed_distir_vs_colossal.csv"))
    assert len(df) == 12
    assert math.isnan(df["model"].iloc[0]) if "model" in df else True
    assert df["num_gpus"].tolist() == [4] * 12
    assert df["dp"].tolist() == [4] * 12
    assert df["has_measurement"].tolist() == [False] * 6 + [True] + [False] * 5
    assert df["measured_step_time_s"].iloc[6] == pytest.approx(4 / 4.5)
    # The simulated values stay visible, but are not measurements.
    assert df["throughput_samples_per_s"].iloc[0] == 3.85


def test_distir_defaults_fill_model_and_hardware(presets):
    df = load_measurements(
        data_path("seed_distir_vs_colossal.csv"),
        defaults={"model": "mlp-small", "hardware": "v100-32gb", "dtype": "float16"},
        purpose="fit",
    )
    assert set(df["model"]) == {"mlp-small"}
    assert set(df["hardware"]) == {"v100-32gb"}
    assert set(df["dtype"]) == {"fp16"}


def test_distir_simulation_model_size_alias(presets):
    df = load_measurements(data_path("seed_distir_simulation.csv"))
    assert df["model"].tolist() == ["gpt2", "gpt2-medium", "gpt2-large", "mlp-small"]
    assert df["tp"].tolist() == [8] * 4 and df["dp"].tolist() == [1] * 4
    assert df["global_batch_size"].tolist() == [128] * 4
    assert df["measured_step_time_s"].iloc[0] == pytest.approx(128 / 143.11)


def test_colossal_readme_row_3_is_rejected_with_file_row_and_column(presets):
    path = data_path("colossalai_readme_benchmark.csv")
    with pytest.raises(AisimError) as e:
        load_measurements(path)
    lines = str(e.value).splitlines()
    assert "1 of 4 rows are invalid" in lines[0]
    assert lines[1].startswith(f"{path}:3: field 'dp'")
    assert "16" in lines[1] and "num_gpus = 8" in lines[1]


def test_colossal_readme_skip_bad_rows_keeps_the_rest(presets):
    df = load_measurements(data_path("colossalai_readme_benchmark.csv"), skip_bad_rows=True)
    assert df["source_row"].tolist() == [1, 2, 4]
    assert len(df.attrs["skipped"]) == 1 and ":3:" in df.attrs["skipped"][0]
    assert df["measured_step_time_s"].iloc[0] == pytest.approx(288 / 17.13)
    assert df["zero_stage"].tolist() == [2, 2, 1]
    assert df["peak_mem_mib"].tolist()[0] == 119040


def test_aliases_case_insensitive_and_colossal_spellings(tmp_path, presets):
    p = write(tmp_path, "Model_Name,GPU_Type,World_Size,TP_Size,PP_Size,Batch_Size,MBS,"
              "Grad_Checkpoint,Precision,Avg_Duration,Sequence_Parallel,Max_Length,Vocab,"
              "Num_Model_Chunks,my_note\n"
              "Llama2-7B,H100-SXM (DGX),8,2,1,64,2,True,BF16,3.5,1,4096,32000,1,hello\n"
              "llama2-7b,h100-sxm,8,2,2,64,2,false,float32,,no,4096,32000,2,\n")  # fmt: skip
    df = load_measurements(p)
    assert df["model"].tolist() == ["llama2-7b", "llama2-7b"]
    assert df["hardware"].tolist() == ["h100-sxm", "h100-sxm"]
    assert df["dp"].tolist() == [4, 2]
    assert df["recompute"].tolist() == ["full", "none"]
    assert df["dtype"].tolist() == ["bf16", "fp32"]
    assert df["sequence_parallel"].tolist() == [True, False]
    assert df["seq_len"].tolist() == [4096, 4096] and df["vocab_size"].tolist() == [32000] * 2
    assert df["interleave"].tolist() == [1, 2]
    assert df["micro_batch_size"].tolist() == [2, 2]
    assert df["has_measurement"].tolist() == [True, False]
    assert df["my_note"].iloc[0] == "hello"


def test_model_card_and_gpu_names_become_the_presets_they_name(tmp_path, presets):
    # a planner's names (the presets' aliases, perfmodel.specs.names) are read as the presets
    p = write(tmp_path, "model,hardware,num_gpus,tp,pp,global_batch_size,step_time_s\n"
              "meta-llama/Llama-2-70b-hf,H100,64,8,1,64,5.0\n"
              "GPT-3,A100-SXM4-80GB,64,8,8,64,5.0\n")  # fmt: skip
    df = load_measurements(p)
    assert df["model"].tolist() == ["llama2-70b", "gpt3-175b"]
    assert df["hardware"].tolist() == ["h100-sxm", "a100-80gb"]


def test_dp_overlap_is_a_boolean_knob(tmp_path, presets):
    # a plain 'no' must not become bool("no") == True: the fit would overlap the DP reduction
    p = write(tmp_path, "model,hardware,num_gpus,batch_size,throughput,dp_overlap\n"
              "gpt2,h200,2,8,2,no\ngpt2,h200,2,8,2,Yes\ngpt2,h200,2,8,2,\n")  # fmt: skip
    df = load_measurements(p, purpose="fit")
    assert df["dp_overlap"].tolist()[:2] == [False, True] and df["dp_overlap"].isna().iloc[2]
    strategies = [row_strategy(rc) for rc in resolve_rows(df)]
    assert [float(s.stack.dp_overlap) for s in strategies] == [
        0.0,
        1.0,
        1.0,
    ]  # blank: the default, overlap
    bad = write(
        tmp_path, "model,hardware,num_gpus,overlap_grad_reduce\ngpt2,h200,2,sometimes\n", "bad.csv"
    )
    with pytest.raises(
        AisimError,
        match=r"bad.csv:1: field 'dp_overlap' = 'sometimes': expected on or off \(yes/no, ",
    ):
        load_measurements(bad)


def test_fused_attention_is_a_boolean_knob(tmp_path, presets):
    # measured with FlashAttention: the column (or its alias) reaches the strategy; blank is off
    p = write(tmp_path, "model,hardware,num_gpus,batch_size,throughput,flash_attention\n"
              "gpt2,h200,2,8,2,yes\ngpt2,h200,2,8,2,no\ngpt2,h200,2,8,2,\n")  # fmt: skip
    df = load_measurements(p, purpose="fit")
    strategies = [row_strategy(rc) for rc in resolve_rows(df)]
    assert [float(s.stack.fused_attention) for s in strategies] == [1.0, 0.0, 0.0]


def test_num_gpus_derived_from_degrees(tmp_path, presets):
    p = write(tmp_path, "model,hardware,dp,tp,pp,global_batch_size,throughput\n"
              "gpt2,a100-80gb,2,2,2,16,8\n")  # fmt: skip
    df = load_measurements(p, purpose="fit")
    assert df["num_gpus"].tolist() == [8]
    assert df["measured_step_time_s"].tolist() == [2.0]


def test_step_time_wins_over_throughput(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus,global_batch_size,step_time_s,throughput\n"
              "gpt2,h200,1,8,0.5,10\n")  # fmt: skip
    assert load_measurements(p)["measured_step_time_s"].tolist() == [0.5]


def test_tp_pp_not_dividing_world_size(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus,tp,pp\ngpt2,h200,6,4,1\n")
    with pytest.raises(AisimError, match=r"m\.csv:1: field 'tp' = 4: expected tp·pp = 4·1 = 4 to "
                       r"divide num_gpus = 6"):  # fmt: skip
        load_measurements(p)


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("nan", "finite"), ("-3", "positive"), ("0", "positive"), ("fast", "a number"),
     ("inf", "finite"), ("1e30", "a number up to 1e+15")],
)  # fmt: skip
def test_bad_throughput_names_row_and_column(tmp_path, presets, cell, expected):
    p = write(tmp_path, f"model,hardware,num_gpus,batch_size,throughput\n"
              f"gpt2,h200,1,8,2\ngpt2,h200,1,8,{cell}\n")  # fmt: skip
    with pytest.raises(AisimError) as e:
        load_measurements(p)
    assert f"m.csv:2: field 'throughput_samples_per_s' = '{cell}'" in str(e.value)
    assert expected in str(e.value)


@pytest.mark.parametrize(
    ("header", "row", "expected"),
    [
        ("num_layers,hidden_size,step_time_s", "2,64,1e30", "'step_time_s' = '1e30': expected seconds up to 1e+07"),
        ("num_layers,hidden_size,step_time_s", "99999999999,64,1", "'num_layers' = '99999999999': expected an integer below 2^31"),
    ],
)  # fmt: skip
def test_a_cell_no_run_can_have_is_refused(tmp_path, presets, header, row, expected):
    # a step of 1e30 s or 10^11 layers is a typo: refused with its row, not fitted (issue 29)
    p = write(tmp_path, f"model,hardware,num_gpus,global_batch_size,{header}\n"
              f"custom,h200,1,8,{row}\n")  # fmt: skip
    with pytest.raises(AisimError) as e:
        load_measurements(p)
    assert f"m.csv:1: field {expected}" in str(e.value)


def test_blank_throughput_is_kept_for_prediction(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus,batch_size,throughput\ngpt2,h200,1,8,\n")
    df = load_measurements(p, purpose="fit")
    assert df["has_measurement"].tolist() == [False]
    assert math.isnan(df["measured_step_time_s"].iloc[0])


def test_unknown_presets_suggest_names(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus\nllama2-7 b,h100-sx,8\ngtp2,a100-80gb,1\n")
    with pytest.raises(AisimError) as e:
        load_measurements(p)
    text = str(e.value)
    assert "2 of 2 rows are invalid" in text
    assert "m.csv:1: field 'hardware' = 'h100-sx': expected a hardware preset; did you mean" in text
    assert "h100-sxm" in text
    assert "m.csv:2: field 'model' = 'gtp2'" in text and "gpt2" in text


def test_custom_model_needs_dimensions(tmp_path, presets):
    ok = write(tmp_path, "model,hardware,num_layers,hidden_size,num_gpus\ncustom,h200,4,256,1\n")
    assert load_measurements(ok)["model"].tolist() == ["custom"]
    bad = write(tmp_path, "model,hardware,num_gpus\ncustom,h200,1\n", "bad.csv")
    with pytest.raises(AisimError, match="'custom' with the columns num_layers, hidden_size"):
        load_measurements(bad)


def test_missing_required_columns_depend_on_purpose(tmp_path, presets):
    p = write(tmp_path, "model,num_gpus,throughput\ngpt2,1,3\n")
    assert len(load_measurements(p)) == 1  # "any": nothing is required
    with pytest.raises(AisimError, match="missing required column 'hardware'.*gpu, gpu_type"):
        load_measurements(p, purpose="predict")
    q = write(tmp_path, "model,hardware,num_gpus\ngpt2,h200,1\n", "q.csv")
    with pytest.raises(AisimError, match="fitting needs a measured value column"):
        load_measurements(q, purpose="fit")
    r = write(tmp_path, "model,hardware,num_gpus,throughput\ngpt2,h200,1,3\n", "r.csv")
    with pytest.raises(AisimError, match="missing required column 'global_batch_size'"):
        load_measurements(r, purpose="fit")


def test_several_bad_values_collected_into_one_error(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus,dp,tp,pp,zero_stage,dtype,recompute\n"
              "gpt2,h200,8,2,2,1,5,fp12,half\n"
              "gpt2,h200,8,,2,2,1,bf16,full\n")  # fmt: skip
    with pytest.raises(InvalidRows) as e:
        load_measurements(p)
    lines = str(e.value).splitlines()
    # the library names its argument; the CLI names the flag (tests/aisim/test_calibrate.py)
    assert e.value.hint == "fix them, or pass {skip_bad_rows} to use the rest"
    assert (
        lines[0]
        == f"{p}: 1 of 2 rows are invalid; fix them, or pass skip_bad_rows to use the rest:"
    )
    assert e.value.rows == [1] and e.value.total == 2
    assert [x.field for x in e.value.problems] == ["zero_stage", "dtype", "recompute", "dp"]
    assert len(lines) == 5
    assert all(line.startswith(f"{p}:1: field ") for line in lines[1:])
    df = load_measurements(p, skip_bad_rows=True)
    assert df["source_row"].tolist() == [2] and df["dp"].tolist() == [2]
    assert len(df.attrs["skipped"]) == 4


def test_all_rows_bad_is_an_error_even_when_skipping(tmp_path, presets):
    p = write(tmp_path, "model,hardware,num_gpus,tp\ngpt2,h200,3,2\n")
    with pytest.raises(AisimError, match="every row is invalid"):
        load_measurements(p, skip_bad_rows=True)


def test_normalise_dataframe_in_memory(presets):
    raw = pd.DataFrame({"model_size": ["GPT2"], "gpu": ["A100-80GB"], "dp_degree": [2],
                        "throughput_samples_s": [4.0], "batch_size": [8]})  # fmt: skip
    df = normalise_measurements(raw, source="mem")
    assert df["model"].tolist() == ["gpt2"] and df["hardware"].tolist() == ["a100-80gb"]
    assert df["measured_step_time_s"].tolist() == [2.0]
    assert df["source_file"].tolist() == ["mem"]


def test_canonical_column_wins_over_alias(tmp_path, presets):
    p = write(tmp_path, "model,model_name,hardware,num_gpus\ngpt2,llama2-7b,h200,1\n"
              ",llama2-7b,h200,1\n")  # fmt: skip
    assert load_measurements(p)["model"].tolist() == ["gpt2", "llama2-7b"]


def test_missing_file_is_a_domain_error(tmp_path):
    with pytest.raises(AisimError, match="file not found"):
        load_measurements(tmp_path / "nope.csv")


def test_real_preset_lists_accept_the_shipped_files():
    """The shipped files load against perfmodel's preset lists."""
    assert meas._preset_names("model") is not None
    load_measurements(data_path("korthikanti2022_table5_iteration_time.csv"))
    load_measurements(data_path("seed_distir_simulation.csv"))
    load_measurements(data_path("colossalai_readme_benchmark.csv"), skip_bad_rows=True)
