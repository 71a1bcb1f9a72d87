"""Where the command line keeps compiled XLA programs between commands (JAX's persistent
compilation cache), and turning that cache on."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "AISIM_XLA_CACHE"


def compilation_cache_dir(environ: dict[str, str] | None = None) -> Path | None:
    """Where compiled XLA programs persist between commands, or None for no cache.

    ``$AISIM_XLA_CACHE`` names the folder (``off`` disables it); by default it is
    ``$XDG_CACHE_HOME/aisim/xla`` (``~/.cache/aisim/xla``). A ``JAX_COMPILATION_CACHE_DIR`` that
    is already set wins, because JAX reads it itself. A folder that cannot be created or written
    gives no cache rather than an error.
    """
    env = os.environ if environ is None else environ
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    choice = env.get(CACHE_ENV, "").strip()
    if choice.lower() in ("off", "0", "no", "false", "none"):
        return None
    if choice:
        folder = Path(choice).expanduser()
    else:
        folder = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aisim" / "xla"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder if os.access(folder, os.W_OK | os.X_OK) else None


def enable_compilation_cache() -> None:
    """Every command compiles its JAX programs (a grid evaluation, a fit, an FL round) before it
    runs them, which is most of a short command's time. JAX's persistent compilation cache keeps
    each executable on disk, keyed by its HLO, the flags and the jax version, so a later command
    loads it instead; results are the same. Entries are small (a GPT grid search writes about
    0.5 MB); the folder can be deleted at any time. JAX's size cap needs the ``filelock`` package,
    which aisim does not depend on, so none is set."""
    folder = compilation_cache_dir()
    if folder is None:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
