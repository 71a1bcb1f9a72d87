"""The command line keeps compiled XLA programs between commands (``simbase.xla_cache``, enabled by ``aisim.app.main``).

Where the cache goes is decided from the environment alone, so those rules are checked on plain
dicts. Then two real commands in fresh processes: the first fills the folder, the second loads
from it, and both print the same document and nothing on stderr (JAX reports cache trouble as
warnings, which would break the one-line error contract).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simbase.xla_cache import CACHE_ENV, compilation_cache_dir

ROOT = Path(__file__).resolve().parents[1]


def test_where_the_cache_goes(tmp_path):
    xdg = tmp_path / "xdg"
    assert compilation_cache_dir({"XDG_CACHE_HOME": str(xdg)}) == xdg / "aisim" / "xla"
    assert (xdg / "aisim" / "xla").is_dir()
    mine = tmp_path / "mine"
    assert compilation_cache_dir({CACHE_ENV: str(mine), "XDG_CACHE_HOME": str(xdg)}) == mine
    for off in ("off", "0", "OFF"):
        assert compilation_cache_dir({CACHE_ENV: off}) is None
    # JAX reads its own variable: aisim leaves it alone
    assert compilation_cache_dir({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "j")}) is None
    # a folder that cannot be made (its parent is a file) gives no cache, not an error
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert compilation_cache_dir({CACHE_ENV: str(blocker / "sub")}) is None


@pytest.mark.slow
def test_second_command_loads_the_first_ones_programs(tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    env[CACHE_ENV] = str(cache)
    cmd = [sys.executable, "-m", "aisim", "perf", "estimate", "--model", "gpt3-13b", "--gpus", "64",
           "--tp", "4", "--pp", "2", "--global-batch", "256", "--json"]  # fmt: skip
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and first.stderr == "", first.stderr
    entries = sorted(p.name for p in cache.iterdir())
    assert entries, "the first command wrote no compiled program"
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and second.stderr == "", second.stderr
    assert json.loads(second.stdout) == json.loads(first.stdout)
    # every program the second command needed was already there
    assert sorted(p.name for p in cache.iterdir()) == entries
