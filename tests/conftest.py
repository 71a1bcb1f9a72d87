"""Test-wide JAX settings.

- Implicit rank promotion is an error, as in equinox's tests.
- One persistent XLA compilation cache for the whole session, in a fresh temporary folder. The
  suite runs the same programs many times in separate processes (every README command, the CLI
  tests, the notebooks), and each would otherwise compile them again: a cache hit loads the
  executable XLA built for the same HLO and flags, so results are unchanged and only compile time
  goes. The folder is set through the environment before JAX is imported, so subprocesses inherit
  it, and it is removed at exit. A cache the caller already set (``JAX_COMPILATION_CACHE_DIR``)
  is kept. The pytest process itself does not write to it: inside one process JAX's in-memory
  cache already compiles each program once, and serialising some large CPU executables has
  aborted the process (``executable.serialize()`` in ``put_executable_and_time``).
"""

import atexit
import os
import shutil
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="aisim-test-xla-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    # cache every program, not only those that took over a second to compile
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_compilation_cache", False)  # subprocesses keep the cache
