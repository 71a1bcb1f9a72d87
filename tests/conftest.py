"""Test-wide JAX settings.

- Implicit rank promotion is an error, as in equinox's tests.
- One persistent XLA compilation cache folder for the whole session: the first process (xdist's
  controller) makes it and removes it at exit, the workers inherit it, and so do the processes
  the tests start (``aisim`` commands, as users run them with the cache on by default, and the doc
  scripts, benchmarks and notebook kernels, through JAX's own ``JAX_COMPILATION_CACHE_DIR``). A
  program that a worker compiled is loaded, not compiled again, by the other worker or a command.
  The workers store only programs that took a second or more to compile: storing every small one
  added to the memory mappings below. The cache's own behaviour is tested in
  ``tests/test_compilation_cache.py`` with a folder of its own.
- No ``$COLUMNS`` or ``$LINES`` from outside: a test that cares about the terminal's width sets
  it itself (pytest-xdist's workers inherit ``COLUMNS=80``, a shell may export its own), so the
  output of a command that goes to a pipe is as wide as it is for users (``aisim.console``).
- JAX's in-memory caches are emptied between test modules once the process holds more than
  :data:`MAX_MAPPINGS` memory mappings. Each compiled XLA:CPU executable keeps a few mappings
  until it is freed; a whole session of step-model compiles passed Linux's default
  ``vm.max_map_count`` (65,530) and LLVM aborted the process mid-compile. Emptying the caches
  after every module instead would recompile the step model in each one (minutes of CI).
"""

import atexit
import gc
import os
import shutil
import tempfile

_CACHE = os.environ.get("AISIM_TEST_XLA_CACHE")
if not _CACHE:  # the session's first process (xdist's controller): one folder for all workers
    _CACHE = tempfile.mkdtemp(prefix="aisim-test-xla-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["AISIM_TEST_XLA_CACHE"] = _CACHE
os.environ["AISIM_XLA_CACHE"] = _CACHE
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE  # wins over AISIM_XLA_CACHE (simbase.xla_cache)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# well under the kernel's default limit of 65,530, with room for one module's compiles
MAX_MAPPINGS = 30_000


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to watch
        return 0


def free_compiled_if_high() -> None:
    """Drops every compiled program when the mappings run high (module docstring)."""
    if _mappings() > MAX_MAPPINGS:
        jax.clear_caches()
        gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_executables():
    yield
    free_compiled_if_high()


@pytest.fixture
def free_compiled():
    """For a module whose tests compile many programs (the documented commands run in the
    test process): the check after each test rather than after the module."""
    yield
    free_compiled_if_high()
