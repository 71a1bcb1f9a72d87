"""The output folder of one run: a lock against a second writer, and the configuration it holds.

Contract: :func:`open_run` takes an exclusive ``fcntl`` lock on ``DIR/.lock`` for as long as the
run lasts (the operating system drops it when the process ends, so a killed run leaves no stale
lock); a second run on the same folder is refused with one line. A fresh run removes a checkpoint
left by an earlier run and writes ``config.json`` atomically; a resumed run requires that the
stored ``config.json`` is the configuration asked for and that the checkpoint was written for it
(:func:`check_same_config`), and refuses otherwise naming the fields that differ.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from simbase.errors import AisimError
from simbase.io import atomic_write_text, to_json

LOCK = ".lock"
CONFIG = "config.json"
CHECKPOINT = "checkpoint.msgpack"


@contextlib.contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Holds the exclusive lock of ``out_dir`` (created if missing) for the ``with`` block."""
    if out_dir.exists() and not out_dir.is_dir():
        raise AisimError(field="out_dir", value=str(out_dir), expected="a folder, not a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AisimError(
                field="out_dir",
                value=str(out_dir),
                expected="a folder no other run is writing (another aisim fl run holds its lock)",
                usage=False,
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the lock


def differing(stored: dict, asked: dict) -> list[str]:
    """The keys whose values differ between two configurations (missing keys count)."""
    return sorted(k for k in set(stored) | set(asked) if stored.get(k) != asked.get(k))


def check_same_config(where: str, stored: dict, asked: dict) -> None:
    """Raises one :class:`AisimError` when ``stored`` (read from ``where``) is not ``asked``."""
    diff = differing(stored, asked)
    if diff:
        shown = ", ".join(f"{k} {stored.get(k)!r} (asked {asked.get(k)!r})" for k in diff[:4])
        more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
        raise AisimError(
            f"{where}: holds another run ({shown}{more}); resume it with its own settings, or "
            "start this one in a new --out folder",
            usage=False,
        )


def start_fresh(out_dir: Path, config: dict) -> None:
    """A new run in ``out_dir``: drops an earlier run's checkpoint, writes ``config.json``."""
    with contextlib.suppress(FileNotFoundError):
        (out_dir / CHECKPOINT).unlink()
    atomic_write_text(out_dir / CONFIG, to_json(config))
