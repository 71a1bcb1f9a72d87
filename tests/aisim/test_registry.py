"""Every knob of the registry (:data:`perfmodel.specs.knobs.KNOBS`) through every door.

Issue 29: a knob is declared once and everything else is derived from it. These tests enumerate
the registry and check each place a knob must reach: the options of `aisim perf estimate`,
`grid`, `sensitivity` and `compare` (less what a command derives), the ``--json`` document, a
value typed on the command line arriving in that document, the grid's restrictions and its
enumeration, the measurement CSV loader under the knob's name and every alias (and a bad cell
rejected with the registry's own words), and ``--set`` refusing a knob its option already gives.
A new knob that misses one of them fails here. The compiled program is checked too: what is
constant over a search (the model's experts, context parallelism, FP8, the stack's eager mode)
is a Python branch, so a program for less has fewer operations and the same numbers.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from aisim.app import app
from calibration.measurements import InvalidRows, normalise_measurements
from perfmodel import AisimError, Scope, Stack, load_hardware, make_strategy, step_time
from perfmodel.search.grid import enumerate_strategies
from perfmodel.search.sweep_grid import GRID_KNOBS, normalise_knobs
from perfmodel.specs.knobs import BY_NAME, KNOBS
from perfmodel.specs.model import model_from_dict

runner = CliRunner()
NAMES = tuple(k.name for k in KNOBS)
COMMANDS = ("estimate", "grid", "sensitivity", "compare")
# what a command derives instead of taking it: a grid searches dp and the microbatches
DERIVED = {
    "estimate": (),
    "sensitivity": (),
    "grid": ("dp", "num_microbatches"),
    "compare": ("dp", "num_microbatches"),
}
# what a command takes as one value though it sweeps the rest
SINGLE = {"compare": ("num_gpus", "global_batch_size")}
# a tiny MoE transformer: 8 layers, 16 heads (8 KV), 16 routed experts, 1024 tokens
MOE = {
    "name": "tiny-moe", "kind": "transformer", "num_layers": 8, "hidden_size": 512,
    "num_heads": 16, "num_kv_heads": 8, "ffn_hidden_size": 1024, "seq_len": 1024,
    "vocab_size": 4096, "num_experts": 16, "experts_per_token": 2, "moe_ffn_hidden_size": 256,
    "dropout": False,
}  # fmt: skip
H100 = load_hardware("h100-sxm")

# every knob at a value of one valid strategy of MOE on 32 H100s, as `--json` shows it; the
# ones at their default here are set by SECOND below
FIRST = dict(
    num_gpus=32, gpus_per_node=4, dp=4, tp=2, pp=2, cp=2, ep=4, etp=2, moe_imbalance=1.25,
    global_batch_size=32, micro_batch_size=2, num_microbatches=4, schedule="interleaved",
    interleave=2, zero_stage=3, shard_size=4, recompute="selective", recompute_layers=0,
    sequence_parallel=True, dtype="fp8", dp_overlap=False, fused_attention=True,
    attention_kernel="fa2", eager=True, logit_bytes=12.0, tp_overlap=True,
    grad_reduce_fp32=False, param_remainders=False, bf16_moments=True, fsdp_reshard=False,
    fsdp_step_gather=True, fsdp_fp32_params=True, recompute_modules="mlp",
    moe_dispatch="allgather", moe_overlap=True, cp_comm="allgather", fp8_recipe="tensorwise",
    dp_bucket_size=5e8,
)  # fmt: skip
# the knobs that need another strategy to leave their default (bf16, full recomputation)
SECOND = dict(
    num_gpus=8, tp=2, pp=2, global_batch_size=8, dtype="bf16", zero_stage=1, recompute="full",
    recompute_layers=2, param_remainders=True,
)  # fmt: skip
# the words a value is typed in where they are not its JSON form
TYPED = {"grad_reduce_fp32": {False: "bf16", True: "fp32"}}


def _command(*path: str):
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _options(command: str) -> dict:
    """Each option string of ``aisim perf COMMAND`` -> its click parameter."""
    return {o: p for p in _command("perf", command).params for o in (*p.opts, *p.secondary_opts)}


def _args(values: dict) -> list[str]:
    """The single-value command line of some knob values."""
    out = []
    for name, value in values.items():
        knob = BY_NAME[name]
        if knob.kind is bool:
            out.append(knob.option if value else "--no-" + knob.option[2:])
        else:
            out += [knob.option, TYPED.get(name, {}).get(value, str(value))]
    return out


def _text(name: str, value) -> str:
    return TYPED.get(name, {}).get(value, "on" if value is True else "off" if value is False
                                   else str(value))  # fmt: skip


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("registry") / "tiny-moe.json"
    path.write_text(json.dumps(MOE))
    return str(path)


# ---------------------------------------------------------------- the commands' options


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_offers_every_knob(command):
    opts = _options(command)
    many = command in ("grid", "compare")
    for knob in KNOBS:
        if knob.name in DERIVED[command]:
            continue
        assert knob.option in opts, f"perf {command} has no {knob.option}"
        param = opts[knob.option]
        if knob.name in SINGLE.get(command, ()):
            assert not param.multiple, f"perf {command} {knob.option} takes one value"
        elif many:
            assert param.multiple, f"perf {command} {knob.option} takes several values"
        elif knob.is_switch:
            assert "--no-" + knob.option[2:] in opts, knob.option
        assert param.help, knob.option


def test_the_registry_is_consistent():
    assert len(set(NAMES)) == len(NAMES)
    options = [k.option for k in KNOBS]
    assert len(set(options)) == len(options)
    spellings = [s for k in KNOBS for s in (k.name, *k.aliases)]
    assert len(set(spellings)) == len(spellings), "a spelling names two knobs"
    assert set(FIRST) == set(NAMES), "FIRST lists every knob"
    for name in NAMES:  # each knob leaves its default in one of the two strategies
        knob = BY_NAME[name]
        default = knob.label(knob.default)
        assert default is None or FIRST[name] != default or SECOND.get(name) != default, name


# ---------------------------------------------------------------- the estimate's document


@pytest.fixture(scope="module")
def documents(moe_file):
    """`perf estimate --json` of the two strategies that give every knob a non-default value."""
    docs = []
    for values in (FIRST, SECOND):
        args = ["perf", "estimate", "--model-file", moe_file, "--hardware", "h100-sxm"]
        r = runner.invoke(app, [*args, *_args(values), "--json"])
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.stdout))
    return docs


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_estimate_json_carries_every_knob_under_its_name(documents):
    for doc in documents:
        assert set(NAMES) <= set(doc)


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_every_knob_typed_reaches_the_document(documents):
    wrong = {}
    for values, doc in zip((FIRST, SECOND), documents, strict=True):
        for name, value in values.items():
            got = doc[name]
            same = got == pytest.approx(value) if isinstance(value, float) else got == value
            if not same or type(got) is not type(value):
                wrong[name] = (value, got)
    assert not wrong, "knob: (typed, in --json): " + repr(wrong)


@pytest.mark.slow  # a several-second compile (pyproject's markers)
def test_every_knob_typed_restricts_the_grid(moe_file):
    """`perf grid` with every knob it takes restricted to FIRST's value searches that strategy:
    its best row carries each of them (dp and the microbatches derived)."""
    args = ["perf", "grid", "--model-file", moe_file, "--hardware", "h100-sxm", "--gpus", "32",
            "--global-batch", "32", "--top", "3", "--json"]  # fmt: skip
    for name, value in FIRST.items():
        if name not in (*DERIVED["grid"], "num_gpus", "global_batch_size"):
            args += [BY_NAME[name].option, _text(name, value)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    best = json.loads(r.stdout)["best"]
    wrong = {}
    for name, value in FIRST.items():
        got = best[name]
        same = got == pytest.approx(value) if isinstance(value, float) else got == value
        if not same or type(got) is not type(value):
            wrong[name] = (value, got)
    assert not wrong, "knob: (typed, in the best row): " + repr(wrong)


def test_set_gives_a_knob_that_no_option_gives():
    """`--set KNOB=VALUE` (any spelling) is the same as the knob's option, including for the
    knobs a command has its own default for."""
    args = ["perf", "estimate", "--model", "gpt3-13b", "--json"]
    typed = ["--gpus", "64", "--tp", "4", "--pp", "4", "--global-batch", "256", "--zero", "1",
             "--recompute", "selective", "--eager"]  # fmt: skip
    sets = ["num_gpus=64", "tp=4", "pp=4", "global_batch=256", "zero=1", "recompute=selective",
            "eager=on"]  # fmt: skip
    r = runner.invoke(app, [*args, *typed])
    assert r.exit_code == 0, r.output
    by_option = json.loads(r.stdout)
    r = runner.invoke(app, [*args, *(x for s in sets for x in ("--set", s))])
    assert r.exit_code == 0, r.output
    by_set = json.loads(r.stdout)
    for name in ("num_gpus", "tp", "pp", "global_batch_size", "zero_stage", "recompute", "eager"):
        assert by_set[name] == by_option[name], name
    assert by_set["step_time_s"] == by_option["step_time_s"]


# ---------------------------------------------------------------- --set against an option


def _refusal(command: str, knob) -> list[str]:
    many = command in ("grid", "compare") and knob.name not in SINGLE.get(command, ())
    value = {"int": "2", "float": "1.5"}.get(getattr(knob.kind, "__name__", ""))
    if knob.is_switch:
        given = [knob.option, "on"] if many else [knob.option]
        value = "on"
    elif value is None:
        value = knob.words()[0] if knob.words() else "mlp"
        given = [knob.option, value]
    else:
        given = [knob.option, value]
    base = {"compare": ["--hardware", "a100-80gb", "--tokens", "1B"]}.get(command, [])
    return ["perf", command, *base, *given, "--set", f"{knob.name}={value}"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.slow
def test_a_knob_given_twice_is_refused(command):
    """A knob given by its option and again with ``--set`` is one line naming ``--set``, before
    any work is done."""
    for knob in KNOBS:
        if knob.name in DERIVED[command]:
            continue
        r = runner.invoke(app, _refusal(command, knob))
        assert r.exit_code == 2, (knob.name, r.output)
        lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "--set" in lines[0] and knob.name in lines[0], r.output


# ---------------------------------------------------------------- the grid


def test_the_grid_can_sweep_every_knob_it_does_not_derive():
    swept = {k.name for k in KNOBS if k.home is not None and k.grid != "derived"}
    # the scale-up domain is one value per hardware (the sweep's gpus_per_node argument), so
    # it is the one knob with a home a grid does not cross
    assert set(GRID_KNOBS) == swept - {"gpus_per_node"}
    # the rest are the sweep's own arguments (num_gpus, global_batch, gpus_per_node) and what
    # it derives (dp, num_microbatches), never restrictions
    rest = {"num_gpus", "global_batch_size", "gpus_per_node", "dp", "num_microbatches"}
    assert set(NAMES) - set(GRID_KNOBS) == rest


@pytest.mark.parametrize("name", sorted(GRID_KNOBS))
def test_grid_restrictions_accept_every_knob_under_every_spelling(name):
    knob = BY_NAME[name]
    text = _text(name, FIRST[name])
    for spelling in (name, *knob.aliases):
        parsed = normalise_knobs({spelling: [text]})
        assert parsed[name] == [knob.parse(text)], spelling
        assert set(parsed) == set(GRID_KNOBS)
    with pytest.raises(AisimError) as e:
        normalise_knobs({name: ["bogus"]})
    assert e.value.field == name


# what a restriction needs of the others to be allowed (a knob's ``requires``) or to matter
CONTEXT = dict(
    interleave=dict(schedule=["interleaved"]), shard_size=dict(zero_stage=[3]),
    recompute_layers=dict(recompute=["full"]), sequence_parallel=dict(tp=[2]),
    attention_kernel=dict(fused_attention=[True]), tp_overlap=dict(tp=[2]),
    fsdp_reshard=dict(zero_stage=[3]), fsdp_step_gather=dict(zero_stage=[3]),
    fsdp_fp32_params=dict(zero_stage=[3]), recompute_modules=dict(recompute=["selective"]),
    moe_dispatch=dict(ep=[2]), moe_overlap=dict(ep=[2]), cp_comm=dict(cp=[2]),
    param_remainders=dict(dtype=["bf16"]),
)  # fmt: skip


@pytest.mark.parametrize("name", sorted(GRID_KNOBS))
def test_the_grid_enumerates_what_a_restriction_asks(name):
    """A grid restricted to one non-default value of a knob has rows, and only with it (a stack
    behaviour: every stack with rows has it)."""
    knob = BY_NAME[name]
    value = knob.parse(_text(name, FIRST[name]))
    g = enumerate_strategies(
        num_layers=8, num_heads=16, num_kv_heads=8, num_gpus=32, global_batch_size=32,
        gpus_per_node=8, num_experts=16, seq_len=1024, allow_cross_node_tp=True,
        supported_dtypes=["bf16", "fp8"], **{name: [value]}, **CONTEXT.get(name, {}),
    )  # fmt: skip
    assert len(g) > 0, name
    if knob.home == "stack":
        for i, _ in g.by_stack():
            assert getattr(g.stacks[i], name) == value, name
    else:
        assert set(np.unique(g.columns[name])) == {np.float32(knob.code(value))}, name


# ---------------------------------------------------------------- the measurement CSV


@pytest.mark.parametrize("name", NAMES)
def test_the_csv_loader_reads_every_knob_under_every_spelling(name):
    knob = BY_NAME[name]
    text = _text(name, FIRST[name])
    want = knob.parse(text)
    for spelling in (name, *knob.aliases):
        for header in {spelling, spelling.upper(), spelling.replace("_", "-")}:
            df = normalise_measurements(pd.DataFrame({header: [text]}), "m.csv")
            got = df[name].iloc[0]
            assert knob.parse(got if not isinstance(got, np.generic) else got.item()) == want, (
                header
            )


@pytest.mark.parametrize("name", NAMES)
def test_the_csv_loader_rejects_a_bad_cell_in_the_registrys_words(name):
    knob = BY_NAME[name]
    with pytest.raises(AisimError) as registry:
        knob.parse("bogus")
    with pytest.raises(InvalidRows) as e:
        normalise_measurements(pd.DataFrame({name: [_text(name, FIRST[name]), "bogus"]}), "m.csv")
    (problem,) = e.value.problems
    assert (problem.source, problem.field, problem.value) == ("m.csv:2", name, "bogus")
    assert problem.expected == registry.value.expected  # the loader speaks the registry's words
    assert registry.value.expected == knob.expected()  # which are what the knob declares
    assert e.value.rows == [2]


# ---------------------------------------------------------------- the compiled program

DENSE = dict(MOE, name="tiny-dense", num_experts=0, experts_per_token=0, moe_ffn_hidden_size=0)


def _equations(jaxpr) -> int:
    """Equations of a jaxpr, those of the jaxprs it calls included."""
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, list | tuple) else (p,):
                inner = getattr(sub, "jaxpr", sub)  # a closed jaxpr holds its jaxpr
                if hasattr(inner, "eqns"):
                    n += _equations(inner)
    return n


def _size(model: dict, s) -> int:
    spec = model_from_dict(model, "m").spec
    return _equations(jax.make_jaxpr(step_time)(spec, H100.spec, H100.constants, s).jaxpr)


def test_the_program_is_specialised_to_the_question():
    """A dense BF16 strategy without CP compiles fewer operations than one with experts,
    context parallelism and FP8, and each of those alone adds its own."""
    dense = make_strategy(dp=4, tp=2)
    assert dense.scope == Scope(cp=False, fp8=False)
    rich = make_strategy(dp=2, tp=2, cp=2, ep=2, dtype="fp8")
    assert rich.scope == Scope(cp=True, fp8=True)
    plain = _size(DENSE, dense)
    assert plain < _size(MOE, rich)
    assert plain < _size(MOE, dense)  # experts
    assert plain < _size(DENSE, make_strategy(dp=2, tp=2, cp=2))  # context parallelism
    assert plain < _size(DENSE, make_strategy(dp=4, tp=2, dtype="fp8"))  # FP8 casts


def test_a_stack_compiles_only_its_own_behaviours():
    """Eager mode off compiles no eager terms: fewer operations than eager on; a behaviour is
    static, so the stack's name (for reports only) shares the compiled program."""
    off = make_strategy(dp=4, tp=2, fused_attention=True)
    on = make_strategy(dp=4, tp=2, fused_attention=True, eager=True)
    assert off.stack.eager is False and on.stack.eager is True
    assert _size(DENSE, off) < _size(DENSE, on)
    assert hash(off.stack) == hash(Stack(fused_attention=True, name="another name"))
    step = jax.jit(step_time)
    spec = model_from_dict(DENSE, "m").spec
    step(spec, H100.spec, H100.constants, off)
    size = step._cache_size()
    renamed = dataclasses.replace(off, stack=dataclasses.replace(off.stack, name="renamed"))
    step(spec, H100.spec, H100.constants, renamed)
    assert step._cache_size() == size


@pytest.mark.parametrize(
    "model, knobs",
    [
        (DENSE, dict(dp=4, tp=2)),
        (DENSE, dict(dp=2, tp=2, cp=2, fused_attention=True, eager=True)),
        (MOE, dict(dp=2, tp=2, ep=2, zero_stage=1, dtype="fp8", sequence_parallel=True)),
    ],
    ids=["dense-bf16", "dense-cp-eager", "moe-fp8"],
)
@pytest.mark.slow
def test_a_specialised_program_gives_the_general_programs_numbers(model, knobs):
    """The program compiled for what a strategy uses equals the one compiled for everything
    (every scope) on the same strategy."""
    spec = model_from_dict(model, "m").spec
    s = make_strategy(**knobs)
    general = dataclasses.replace(s, scope=Scope(cp=True, fp8=True))
    a = jax.jit(step_time)(spec, H100.spec, H100.constants, s)
    b = jax.jit(step_time)(spec, H100.spec, H100.constants, general)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=0)
