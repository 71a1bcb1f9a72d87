"""simbase.prefetch: a module imported in a thread, started when a program goes to XLA."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp

from simbase.prefetch import import_in_background, import_while_compiling


def _module(tmp_path, monkeypatch, name, body="VALUE = 42\n"):
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_a_module_is_imported_in_a_thread(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "prefetched_a")
    thread = import_in_background("prefetched_a")
    assert thread is not None
    thread.join()
    assert sys.modules["prefetched_a"].VALUE == 42
    assert import_in_background("prefetched_a") is None  # loaded: nothing to start


def test_a_failed_import_is_left_to_the_main_thread(tmp_path, monkeypatch, capfd):
    _module(tmp_path, monkeypatch, "prefetched_bad", "raise ValueError('broken module')\n")
    import_in_background("prefetched_bad").join()
    assert "prefetched_bad" not in sys.modules and capfd.readouterr().err == ""
    try:
        import prefetched_bad  # noqa: F401
    except ValueError as e:
        assert str(e) == "broken module"
    else:
        raise AssertionError("the main thread's import must raise")


def test_the_import_starts_when_a_program_is_compiled(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "prefetched_c")
    import_while_compiling("prefetched_c")
    assert "prefetched_c" not in sys.modules  # nothing before a program is lowered
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.float32(0.5))  # a new program: lowered
    threads = [t for t in __import__("threading").enumerate() if t.name == "import prefetched_c"]
    for t in threads:
        t.join()
    assert sys.modules["prefetched_c"].VALUE == 42  # imported by no one else


def test_aisim_perf_grid_needs_pandas_only_after_compiling():
    # a fresh process: the perf area and everything a grid search runs before its program is
    # compiled load no pandas (so that the thread above imports it while XLA compiles), and
    # building the model, hardware, constants and grid compiles no program of its own
    code = textwrap.dedent(
        """
        import sys
        import jax
        from aisim.app import build_app
        build_app("perf")
        from perfmodel import load_hardware, load_model
        from perfmodel.search.sweep_grid import normalise_knobs, pair_grid
        compiled = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda event, secs, **kw: compiled.append(event)
            if event.endswith("backend_compile_duration") else None
        )
        m, hw = load_model("gpt3-175b"), load_hardware("a100-80gb")
        grid = pair_grid(m, hw, [1024], [1536], 8, normalise_knobs({}))
        assert len(grid) > 1000
        grid.strategy()
        print("pandas" in sys.modules, len(compiled))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "0"], r.stdout + r.stderr[-2000:]
