"""Test-wide JAX settings.

- Implicit rank promotion is an error, as in equinox's tests.
- No persistent XLA compilation cache, in this process or in the commands the tests start
  (``AISIM_XLA_CACHE=off``): serialising the multi-device grid executables to the cache aborted
  the whole process (``executable.serialize()`` in JAX's ``put_executable_and_time``). The cache's
  own behaviour is tested in ``tests/test_compilation_cache.py`` with a folder of its own.
- JAX's in-memory caches are emptied after every test module. Each compiled XLA:CPU executable
  keeps a few memory mappings until it is freed; a whole session of step-model compiles passed
  Linux's default ``vm.max_map_count`` (65,530) and LLVM aborted the process mid-compile.
"""

import gc
import os

os.environ["AISIM_XLA_CACHE"] = "off"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_compilation_cache", False)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_executables():
    """Drop every compiled program once a module's tests are done (see the module docstring)."""
    yield
    jax.clear_caches()
    gc.collect()
