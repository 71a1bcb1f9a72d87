"""Host numbers as JAX arrays without compiling anything.

``jnp.asarray(x, jnp.float32)`` on a Python number or a numpy array compiles a small
conversion program the first time it meets each shape (tens of milliseconds each on a CPU);
building the default grid's model, hardware, constants and strategies met seven such shapes.
:func:`f32` converts on the host and copies the result to the device: the same float32
values, nothing compiled.
"""

from __future__ import annotations

import jax
import numpy as np


def f32(x) -> jax.Array:
    """``x`` (a number, a sequence or a numpy array, not a traced value) as a float32 array
    on the default device, as ``jnp.asarray(x, jnp.float32)`` gives it."""
    return jax.device_put(np.asarray(x, np.float32))
