"""Colossal-AI benchmark log text -> runs: each run's launcher command line and result values.

Contract: :func:`split_runs` splits a log into :class:`Run` s (a launcher command line starts a
new one); :func:`parse_command` reads the launcher's and ``benchmark.py``'s flags from a command
line (no defaults applied) and :func:`parse_results` the result lines of one run (the formats are
listed in ``calibration.colossal``). :func:`read_log` reads a log file with one clear error.
Turning a run into a measurement row is ``calibration.colossal``'s job.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simbase.errors import AisimError

_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_LAUNCHER = re.compile(
    r"(?:^|[\s;&|(])(colossalai\s+run|torchrun|python3?\s+-m\s+torch\.distributed\.(?:run|launch)"
    r"|deepspeed)\s"
)
_THROUGHPUT = re.compile(r"Throughput:\s*" + _NUM + r"\s*samples/sec")
_TFLOPS_MEGATRON = re.compile(r"TFLOPS per GPU by Megatron:\s*" + _NUM)
_TFLOPS = re.compile(r"TFLOPS per GPU:\s*" + _NUM)
_MAX_MEM = re.compile(r"Max CUDA memory usage:\s*" + _NUM + r"\s*MB")
_PARAMS = re.compile(r"Model params:\s*" + _NUM + r"\s*([KMBT]?)\b")
_LEGACY_EPOCH = re.compile(r"\[Epoch \d+ / Train\]:.*?\bThroughput\s*=\s*" + _NUM)
_LEGACY_STEP = re.compile(_NUM + r"\s*sample_per_sec")
_LEGACY_TIME = re.compile(r"Train-step:\s*last\s*=\s*" + _NUM + r"\s*s,\s*mean\s*=\s*" + _NUM)
_LEGACY_DIST = re.compile(
    r"data parallel size:\s*(\d+),\s*pipeline parallel size:\s*(\d+),\s*tensor parallel size:\s*(\d+)"
)
_LEGACY_BATCH = re.compile(r"global batch size\s*=\s*(\d+)")
# Colossal-AI's format_numel_str uses binary multiples (B = 1024**3).
_NUMEL = {"": 1, "K": 1024, "M": 1024**2, "B": 1024**3, "T": 1024**4}


@dataclass
class Run:
    """One run found in a log: its command line and the result lines after it."""

    command: str | None = None
    lines: list[str] = field(default_factory=list)


def split_runs(text: str) -> list[Run]:
    """Splits a log into runs; each launcher command line starts a new one."""
    runs = [Run()]
    for line in text.splitlines():
        if _LAUNCHER.search(line) and ".py" in line:
            runs.append(Run(command=line.strip()))
        else:
            runs[-1].lines.append(line)
    if runs[0].command is None and not any(has_result(ln) for ln in runs[0].lines):
        runs = runs[1:]
    return runs


def has_result(line: str) -> bool:
    return bool(_THROUGHPUT.search(line) or _LEGACY_EPOCH.search(line) or "sample_per_sec" in line)


def _script_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("-c", "--config", "--model_type")
    p.add_argument("-p", "--plugin", "--distplan")
    p.add_argument("-b", "--batch_size", type=int)
    p.add_argument("-l", "--max_length", "--seq_len", type=int)
    p.add_argument("-g", "--grad_checkpoint", action="store_true", default=None)
    p.add_argument("--tp", "--tp_degree", type=int)
    p.add_argument("--pp", type=int)
    p.add_argument("--sp", type=int)
    p.add_argument("--zero", type=int)
    p.add_argument("--mbs", type=int)
    p.add_argument("--pp_style")
    p.add_argument("--n_chunks", type=int)
    return p


def parse_command(command: str) -> dict[str, Any]:
    """Reads launcher and script flags from one command line (no defaults applied)."""
    try:
        tokens = shlex.split(command, comments=False)
    except ValueError:
        tokens = command.split()
    script_at = next((i for i, t in enumerate(tokens) if t.endswith(".py")), len(tokens))
    launcher, script = tokens[:script_at], tokens[script_at + 1 :]
    cfg: dict[str, Any] = {}
    for i, tok in enumerate(launcher):
        name, _, value = tok.partition("=")
        if not value and i + 1 < len(launcher):
            value = launcher[i + 1]
        if name in ("--nproc_per_node", "--nproc-per-node") and value.isdigit():
            cfg["nproc_per_node"] = int(value)
        elif name in ("--nnodes", "--num_nodes", "--num-nodes") and value.isdigit():
            cfg["nnodes"] = int(value)
        elif name == "--hostfile":
            cfg["hostfile"] = value
    if script_at < len(tokens):
        cfg["script"] = os.path.basename(tokens[script_at])
    args, _ = _script_parser().parse_known_args(script)
    cfg.update({k: v for k, v in vars(args).items() if v is not None})
    return cfg


def _last(pattern: re.Pattern, lines: list[str]) -> re.Match | None:
    found = None
    for line in lines:
        for m in pattern.finditer(line):
            found = m
    return found


def parse_results(lines: list[str]) -> dict[str, Any]:
    """Reads the result lines of one run (the last occurrence of each wins)."""
    res: dict[str, Any] = {}
    m = _last(_THROUGHPUT, lines)
    if m is not None:
        line = m.string
        res["throughput_samples_per_s"] = float(m.group(1))
        meg, plain = _TFLOPS_MEGATRON.search(line), _TFLOPS.search(line)
        res["log_format"] = "current" if meg else "older"
        if meg:
            res["tflops_per_gpu_megatron"] = float(meg.group(1))
        if plain:
            res["tflops_per_gpu"] = float(plain.group(1))
    else:
        epoch = _last(_LEGACY_EPOCH, lines)
        steps = [float(m.group(1)) for ln in lines for m in _LEGACY_STEP.finditer(ln)]
        if epoch is not None:
            res["throughput_samples_per_s"] = float(epoch.group(1))
        elif steps:
            res["throughput_samples_per_s"] = statistics.median(steps)
        if "throughput_samples_per_s" in res:
            res["log_format"] = "legacy"
        t = _last(_LEGACY_TIME, lines)
        if t is not None:
            res["step_time_s"] = float(t.group(2))
        d = _last(_LEGACY_DIST, lines)
        if d is not None:
            res["dp"], res["pp"], res["tp"] = (int(x) for x in d.groups())
        b = _last(_LEGACY_BATCH, lines)
        if b is not None:
            res["global_batch_size"] = int(b.group(1))
    if (m := _last(_MAX_MEM, lines)) is not None:
        res["peak_mem_mib"] = float(m.group(1))  # Colossal-AI divides bytes by 1024**2
    if (m := _last(_PARAMS, lines)) is not None:
        res["num_params"] = round(float(m.group(1)) * _NUMEL[m.group(2)])
    return res


def read_log(path: str | os.PathLike) -> str:
    """A log's text (bytes that are not UTF-8, as a progress bar may write, are replaced).

    Raises:
      AisimError: the file is missing, not a regular file (a directory, a FIFO) or unreadable.
    """
    path = Path(path)
    try:
        if path.exists() and not path.is_file():
            raise AisimError(f"{path}: not a regular file (expected a log file)", source=str(path))
        return path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        raise AisimError(f"{path}: file not found", source=str(path)) from None
    except OSError as e:
        reason = e.strerror or e
        raise AisimError(f"{path}: cannot read the log file ({reason})", source=str(path)) from None
