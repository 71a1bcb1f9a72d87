"""XLA:CPU's options for a program that runs briefly: compiled for a fast start.

Contract: :data:`FAST_CPU_COMPILE` is LLVM at -O0 with XLA:CPU's classic loop emitters. A
program compiles in a quarter to a fifth of the time XLA's defaults take and runs slower (about
5x for the step model's scalar arithmetic, 1.2-3.3x for a federated round, least where
convolutions dominate); results agree to float rounding. :func:`fast_cpu_options` gives them on
XLA:CPU only: accelerators compile with their defaults. Who decides when a program is short
enough: :func:`perfmodel.search.evaluate.compile_options` (a grid's rows) and
:func:`fl.build.round_compile_options` (a run's training FLOPs).
"""

from __future__ import annotations

import jax

FAST_CPU_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def fast_cpu_options(platform: str | None = None) -> dict | None:
    """:data:`FAST_CPU_COMPILE` (a copy) on XLA:CPU, else None (the backend's defaults).

    Args:
      platform: the JAX platform (default: that of the first device).
    """
    platform = jax.devices()[0].platform if platform is None else platform
    return dict(FAST_CPU_COMPILE) if platform == "cpu" else None
