"""`aisim presets` and `aisim --version` through the CLI: every preset listed, the board power
of each hardware, and tables that fit the terminal."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from aisim import __version__
from aisim.app import app
from perfmodel import hardware_names, load_hardware, model_names

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and __version__ in r.output


def test_a_command_imports_only_its_own_area():
    # `aisim presets` through the console script's entry point, in a fresh process: its area's
    # module only, none of the federated engine, the cross-site model or the other areas' CLIs
    code = (
        "import sys; sys.argv = ['aisim', 'presets', '--json']\n"
        "from aisim.app import AREAS, main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "others = [m for m, _, _ in AREAS.values() if m != 'aisim.presets']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fl', 'collab') or m in others))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-500:] + r.stderr


def test_presets_lists_everything():
    r = run("presets", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [h["name"] for h in doc["hardware"]] == hardware_names()
    assert [m["name"] for m in doc["models"]] == model_names()
    for required in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "cpu-host"):
        assert required in hardware_names()
    r = run("presets", "hardware")
    assert r.exit_code == 0 and "a100-80gb" in r.output


def test_presets_show_the_board_power():
    r = runner.invoke(app, ["presets", "hardware", "--json"])
    assert r.exit_code == 0, r.output
    power = {h["name"]: h["board_power_w"] for h in json.loads(r.output)["hardware"]}
    assert power == {n: load_hardware(n).board_power_w for n in hardware_names()}
    assert power["b200"] == 1000.0 and power["cpu-host"] is None
    wide = runner.invoke(app, ["presets", "hardware", "--wide"], env={"COLUMNS": "80"}).stdout
    b200 = next(line for line in wide.splitlines() if "b200" in line)
    assert "board W" in wide and b200.split("│")[-2].strip() == "1000"
    for columns in (60, 80, 100):
        out = runner.invoke(app, ["presets", "hardware"], env={"COLUMNS": str(columns)}).stdout
        assert max(len(line) for line in out.splitlines()) <= columns, out
        assert "hidden: board W" in out  # the first column hidden when narrow
    out = runner.invoke(app, ["presets", "hardware"], env={"COLUMNS": "120"}).stdout
    assert "board W" in out and "hidden:" not in out


def test_one_stack_lists_every_behaviour_and_default_with_the_file_s_own_source():
    """`aisim presets stacks NAME` says what the stack does and chooses, each with the source
    its file cites: the behaviours cover every stack knob of the registry, a version's entries
    win over its base's, and the values are the ones a strategy gets."""
    from perfmodel.specs.knobs import STACK_KNOBS
    from perfmodel.specs.stack_preset import _stacks_dir

    r = run("presets", "stacks", "torchtitan@2024-12", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {(k["kind"], k["knob"]): k for k in doc["knobs"]}
    assert {knob for kind, knob in rows if kind == "behaviour"} == {k.name for k in STACK_KNOBS}
    file = json.loads((_stacks_dir() / "torchtitan.json").read_text())
    version = file["variants"]["2024-12"]["behaviours"]
    assert rows["behaviour", "cp_comm"]["source"] == version["cp_comm"]["source"]
    assert rows["behaviour", "logit_bytes"]["value"] == "16 if tp > 1; 12 otherwise"
    base_only = next(k for k in file["behaviours"] if k not in version)
    assert rows["behaviour", base_only]["source"] == file["behaviours"][base_only]["source"]
    assert rows["default", "recompute"]["source"] == file["defaults"]["recompute"]["source"]
    # one strategy under the stack gets these values
    from perfmodel import estimate

    res = estimate("llama3-8b", hardware="h100-sxm", num_gpus=8, tp=2, pp=1, global_batch=8,
                   stack="torchtitan@2024-12").to_dict()  # fmt: skip
    assert res["logit_bytes"] == 16 and res["cp_comm"] == "torch"


def test_only_stacks_take_a_name_and_an_unknown_stack_is_one_line():
    r = run("presets", "hardware", "h100-sxm")
    assert r.exit_code == 2 and "only 'stacks' takes a name" in r.output
    r = run("presets", "stacks", "torchtitn")
    assert r.exit_code in (1, 2) and "torchtitan" in r.output and "Traceback" not in r.output
