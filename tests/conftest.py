"""Test-wide JAX settings: implicit rank promotion is an error, as in equinox's tests."""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
