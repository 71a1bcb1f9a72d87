"""Test-wide JAX settings.

- Implicit rank promotion is an error, as in equinox's tests.
- No persistent XLA compilation cache, in this process or in the commands the tests start
  (``AISIM_XLA_CACHE=off``): serialising the multi-device grid executables to the cache aborted
  the whole process (``executable.serialize()`` in JAX's ``put_executable_and_time``). The cache's
  own behaviour is tested in ``tests/test_compilation_cache.py`` with a folder of its own.
"""

import os

os.environ["AISIM_XLA_CACHE"] = "off"

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_compilation_cache", False)
