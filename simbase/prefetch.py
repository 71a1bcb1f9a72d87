"""Importing a module in a background thread while the main thread traces and compiles.

``aisim perf grid`` traces and compiles its JAX program before it needs pandas (for the
results table). Importing pandas takes about a third of a second of a cold command, and XLA's
compiler runs without Python's global interpreter lock, so a thread that starts the import
when the program goes to the compiler does it on another core meanwhile. The main thread's
own ``import pandas`` later waits for that import to finish (Python holds one import lock per
module) and then finds the module loaded.
"""

from __future__ import annotations

import importlib
import sys
import threading


def import_in_background(*names: str) -> threading.Thread | None:
    """Starts importing the modules ``names`` that are not loaded yet in a thread, and returns
    it (None when all are loaded). Call it after the modules the main thread is importing,
    so that the two threads never import the same module at once. A failed import is left to
    the main thread's own import of the module, which raises it there."""
    missing = [n for n in names if n not in sys.modules]
    if not missing:
        return None

    def load() -> None:
        for name in missing:
            try:
                importlib.import_module(name)
            except Exception:  # reported by the main thread's import of the same module
                return

    thread = threading.Thread(target=load, name=f"import {', '.join(missing)}")
    thread.start()
    return thread


# what JAX records when it has lowered a traced program to MLIR, just before XLA compiles it
# (``jax._src.dispatch.JAXPR_TO_MLIR_MODULE_EVENT``)
LOWERED_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def import_while_compiling(*names: str) -> None:
    """Imports ``names`` in a thread (:func:`import_in_background`) once JAX has lowered the next
    program it compiles, so that the import runs beside XLA's compiler and not beside the
    tracing, which needs the interpreter lock too. If that moment never comes (a program
    loaded from the compilation cache is lowered too, so it does), the main thread imports the
    modules itself when it needs them."""
    if all(n in sys.modules for n in names):
        return  # nothing to do, and no listener left behind in a process that runs many commands
    import jax

    started = False

    def on_event(event: str, duration_secs: float, **kwargs) -> None:
        nonlocal started
        if event == LOWERED_EVENT and not started:
            started = True
            import_in_background(*names)

    jax.monitoring.register_event_duration_secs_listener(on_event)
