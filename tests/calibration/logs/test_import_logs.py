"""import_logs and detect_format: detection, overrides, missing fields, the measurement loader."""

import re

import pandas as pd
import pytest

import calibration
from calibration.logs import FORMATS, detect_format, import_logs
from simbase.errors import AisimError

LOGS = {
    "megatron": "megatron_gpt_tp2_pp2.log",
    "torchtitan": "torchtitan_llama3_8b_fsdp4_tp2.log",
    "deepspeed": "deepspeed_zero2_bf16_8gpu.log",
    "colossal": "colossal_llama2_13b_gemini_namespace.log",
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_detect_each_format(fixture_path, fmt):
    assert detect_format(fixture_path(LOGS[fmt]).read_text()) == fmt


def test_detect_older_colossal_and_megatron_deepspeed(fixture_path):
    from pathlib import Path

    old = Path(__file__).parents[1] / "fixtures" / "llama2_13b_gemini_older.log"
    assert detect_format(old.read_text()) == "colossal"
    # Megatron-DeepSpeed prints DeepSpeed's configuration and Megatron's iteration lines.
    both = fixture_path(LOGS["deepspeed"]).read_text().split("epoch=0", 1)[0]
    both += fixture_path(LOGS["megatron"]).read_text()
    assert detect_format(both) == "megatron"


def test_detect_unknown_names_the_field():
    with pytest.raises(AisimError) as e:
        detect_format("hello\nworld\n", "x.log")
    assert e.value.field == "format" and e.value.source == "x.log"


def test_forced_format_and_bad_format(fixture_path):
    df = import_logs([fixture_path(LOGS["megatron"])], format="megatron")
    assert list(df["format"]) == ["megatron"]
    with pytest.raises(AisimError) as e:
        import_logs([fixture_path(LOGS["megatron"])], format="nemo")
    assert e.value.field == "format" and e.value.value == "nemo"
    with pytest.raises(AisimError) as e:  # a torchtitan parser finds no step line in it
        import_logs([fixture_path(LOGS["megatron"])], format="torchtitan")
    assert "step: N" in str(e.value)


def test_overrides_win_with_provenance_option(fixture_path):
    ov = {"tp": 4, "hardware": "h100-sxm", "model": None}
    (row,) = import_logs([fixture_path(LOGS["megatron"])], overrides=ov).to_dict("records")
    assert row["tp"] == 4 and row["hardware"] == "h100-sxm"
    # Derived values follow the override: dp = 8/(4·2) = 1, microbatches = 32/(1·1) = 32.
    assert row["dp"] == 1 and row["num_microbatches"] == 32
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert prov["tp"] == "option" and prov["hardware"] == "option" and prov["dp"] == "derived"
    assert prov["pp"].startswith("L") and row["model"] == "custom"


def test_every_stack_behaviour_of_the_registry_is_an_import_override(fixture_path):
    # the imported table's stack columns come from the registry, so a behaviour the log does not
    # print (eager PyTorch, an unfused loss) can be stated at import, under any knob's name
    from calibration.logs import OVERRIDES
    from perfmodel.specs.knobs import STACK_KNOBS

    assert {k.name for k in STACK_KNOBS} <= set(OVERRIDES)
    ov = {"eager": True, "logit_bytes": 12.0}
    (row,) = import_logs([fixture_path(LOGS["megatron"])], overrides=ov).to_dict("records")
    assert row["eager"] is True and row["logit_bytes"] == 12.0
    prov = dict(x.split("=", 1) for x in row["provenance"].split(";"))
    assert prov["eager"] == "option" and prov["logit_bytes"] == "option"


def test_unknown_override_is_an_error(fixture_path):
    with pytest.raises(AisimError) as e:
        import_logs([fixture_path(LOGS["megatron"])], overrides={"gpus": 8})
    assert e.value.field == "overrides" and e.value.value == "gpus"


def test_megatron_without_world_size_names_the_field(fixture_path, tmp_path):
    text = fixture_path(LOGS["megatron"]).read_text()
    text = "\n".join(
        ln for ln in text.splitlines() if "world_size" not in ln and "using world" not in ln
    )
    log = tmp_path / "run.log"
    log.write_text(text)
    with pytest.raises(AisimError) as e:
        import_logs([log])
    assert (e.value.field, e.value.source, e.value.hint) == (
        "num_gpus",
        str(log),
        "pass {num_gpus}",
    )
    assert "--" not in str(e.value)  # library text names no flag
    (row,) = import_logs([log], overrides={"num_gpus": 8}).to_dict("records")
    assert row["num_gpus"] == 8 and "num_gpus=option" in row["provenance"]


def test_deepspeed_without_model_names_the_field(fixture_path):
    with pytest.raises(AisimError) as e:
        import_logs([fixture_path(LOGS["deepspeed"])])
    assert e.value.field == "model"


def test_missing_file_is_one_error(tmp_path):
    with pytest.raises(AisimError, match="not found"):
        import_logs([tmp_path / "nope.log"])


def test_rows_load_through_the_measurement_loader(fixture_path, tmp_path):
    paths = [fixture_path(name) for name in LOGS.values()]
    ov = {"num_gpus": 8, "model": "llama3-8b", "hardware": "h100-sxm"}
    df = import_logs(paths, overrides=ov)
    assert list(df["format"]) == ["megatron", "torchtitan", "deepspeed", "colossal"]
    norm = calibration.normalise_measurements(df, source="logs", purpose="fit")
    assert norm["has_measurement"].all()
    assert norm["measured_step_time_s"].tolist() == pytest.approx(df["step_time_s"].tolist())
    # ... and through a CSV, as `aisim calibrate fit` will read them.
    csv = tmp_path / "m.csv"
    df.to_csv(csv, index=False)
    back = calibration.load_measurements(csv, purpose="fit")
    assert back["measured_step_time_s"].tolist() == pytest.approx(df["step_time_s"].tolist())
    assert back["provenance"].tolist() == df["provenance"].tolist()


def test_canonical_columns_first_meta_last(fixture_path):
    df = import_logs([fixture_path(LOGS["megatron"])])
    cols = list(df.columns)
    assert cols[0] == "model"
    assert cols[-6:] == ["step_time_s", "step_time_std_s", "iterations_averaged", "format",
                         "source", "provenance"]  # fmt: skip
    assert re.fullmatch(r".*megatron_gpt_tp2_pp2\.log:L\d+-L\d+", df["source"][0])
    assert isinstance(df, pd.DataFrame)


def test_megatron_without_shape_asks_for_a_model(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "------------------------ arguments ------------------------\n"
        "  global_batch_size ............................... 8\n"
        "  world_size ...................................... 8\n"
        "-------------------- end of arguments ---------------------\n"
        " iteration       10/     100 | elapsed time per iteration (ms): 900.0 | global batch"
        " size:     8 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
        " iteration       20/     100 | elapsed time per iteration (ms): 800.0 | global batch"
        " size:     8 | number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    with pytest.raises(AisimError) as e:
        import_logs([log])
    assert e.value.field == "num_layers" and e.value.hint == "pass {model}"
    (row,) = import_logs([log], overrides={"model": "gpt3-1.3b"}).to_dict("records")
    assert row["model"] == "gpt3-1.3b" and row["step_time_s"] == pytest.approx(0.8)
