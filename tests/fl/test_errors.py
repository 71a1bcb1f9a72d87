"""fl's errors are data: the library names its own fields (no command-line flags), the CLI maps
them to flags, and a bad value read from an experiment file names that file."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from aisim.app import app
from fl import ExperimentConfig
from fl.build import chunk_size
from fl.config import load_toml, validate
from fl.data import load
from fl.models import make_model
from fl.partition import dirichlet
from fl.server import make_algorithm
from fl.simulation import load_config_json
from fl.systems import parse_mix
from simbase.errors import AisimError

CFG = ExperimentConfig()


@pytest.mark.parametrize(
    "change, field, value",
    [
        ({"dataset": "cifar"}, "dataset", "cifar"),
        ({"algorithm": "fedsgdd"}, "algorithm", "fedsgdd"),
        ({"clients": 10, "clients_per_round": 11}, "clients_per_round", 11),
        ({"local_epochs": 0}, "local_epochs", 0),
        ({"server_lr": -1.0}, "server_lr", -1.0),
        ({"mu": -1.0}, "mu", -1.0),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha", 0.0),
        ({"memory_budget": "lots"}, "memory_budget", "lots"),
        ({"devices": "toaster"}, "devices", "toaster"),
        ({"devices": "phone:x"}, "devices", "phone:x"),
    ],
)
def test_validate_names_the_config_field(change, field, value):
    with pytest.raises(AisimError) as e:
        validate(dataclasses.replace(CFG, **change))
    assert (e.value.source, e.value.field, e.value.value) == (None, field, value)
    assert "--" not in str(e.value)


def test_validate_with_a_source_names_it():
    with pytest.raises(AisimError) as e:
        validate(dataclasses.replace(CFG, lr=-1.0), where="exp.toml")
    assert str(e.value) == "exp.toml: field 'lr' = -1.0: expected a finite learning rate > 0"


def test_hint_names_other_fields_through_the_callers_names():
    with pytest.raises(AisimError) as e:
        validate(dataclasses.replace(CFG, clients=10, clients_per_round=11))
    assert e.value.render({"clients": "--clients"}).endswith("lower it or raise --clients")


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: load("cifar", 10), "dataset"),
        (lambda: load("synthetic", 2_000_000), "clients"),
        (lambda: make_model("resnet", (4,), 2), "model"),
        (lambda: make_model("cnn", (60,), 2), "model"),
        (lambda: make_algorithm("fedsgdd"), "algorithm"),
        (lambda: parse_mix("phone:-1"), "devices"),
        (lambda: parse_mix("phone:0"), "devices"),
        (lambda: chunk_size(1.0, 2e4, 10, 1), "memory_budget"),
        (lambda: load_config_json("/nonexistent-aisim-run"), "out_dir"),
    ],
)
def test_library_errors_name_fields_not_flags(call, field):
    with pytest.raises(AisimError) as e:
        call()
    assert e.value.field == field and e.value.source is None
    assert "--" not in str(e.value)


def test_dirichlet_too_few_samples_hints_at_clients():
    import numpy as np

    with pytest.raises(AisimError) as e:
        dirichlet(np.zeros(4, np.int32), 4, 0.01, np.random.default_rng(0))
    assert e.value.field == "clients"
    assert e.value.render({"clients": "--clients"}).endswith("use fewer --clients")


def test_toml_errors_name_the_file(tmp_path):
    bad = tmp_path / "exp.toml"
    bad.write_text("lr = [\n")
    with pytest.raises(AisimError, match="exp.toml: not valid TOML"):
        load_toml(bad)
    with pytest.raises(AisimError, match="experiment file not found"):
        load_toml(tmp_path / "missing.toml")


def test_cli_names_the_file_a_bad_value_came_from(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text("lr = -1.0\n")
    res = CliRunner().invoke(app, ["fl", "run", "--config", str(cfg)])
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "exp.toml: field 'lr' = -1.0" in lines[0], res.stderr
    # the same value given on the command line names the flag
    res = CliRunner().invoke(app, ["fl", "run", "--config", str(cfg), "--lr", "-2"])
    assert "command line: field '--lr' = -2.0" in res.stderr
