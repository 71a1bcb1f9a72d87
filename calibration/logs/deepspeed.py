"""DeepSpeed training logs -> measurement rows.

Contract: :func:`parse` reads what DeepSpeed itself prints (its logger's prefix is
``[time] [INFO] [file.py:line:func]``; the pdsh launcher adds ``worker-N:``):

- the launcher's ``dist_world_size=N`` (the world size);
- ``DeepSpeedEngine configuration:`` followed by ``  name ....... value`` lines
  (``runtime/config.py`` ``print``: ``train_batch_size``, ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps``, ``zero_optimization_stage``, ``fp16_enabled``,
  ``bfloat16_enabled``, ``world_size`` = the data-parallel size) and its ``json = {...}``;
- the ``ThroughputTimer`` lines (``utils/timer.py``) every ``steps_per_print`` steps:
  ``epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=R, CurrSamplesPerSec=C, ...``,
  where ``C`` is ``train_batch_size`` over the time of that one global step, so its step time is
  ``train_batch_size / C``;
- the FLOPS profiler summary (``profiling/flops_profiler/profiler.py``): ``world size``,
  ``data parallel size``, ``model parallel size``, ``batch size per GPU``, ``iter latency`` and
  ``FLOPS per GPU``, used for the world size and the FLOP rate;
- before DeepSpeed 0.7 (2022-07), the timer printed ``E/S, SamplesPerSec=A`` every
  ``steps_per_print`` micro-steps, ``A`` a running average: see :func:`_from_running_average`.

Every rank prints the timer line (one node's ranks share stdout without a prefix): the first
line of each global step counts, the others are dropped. A timer line after a ``[deepspeed]
OVERFLOW! ... Skipping step`` line is left out (fp16 loss scaling skipped a step). A step count
that goes back starts a new stretch, whose warm-up is dropped again. DeepSpeed does not print
the model: the caller gives it (``model``), or the row cannot be built.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from calibration.logs.rows import (
    RowBuilder,
    Sample,
    clean_lines,
    drop_warmup,
    parse_scalar,
    summarise,
)
from simbase.errors import AisimError

FORMAT = "deepspeed"
_NUM = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|inf|nan))"
TIMER = re.compile(
    r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=" + _NUM
    + r", CurrSamplesPerSec=" + _NUM
)  # fmt: skip
# Before DeepSpeed 0.7 (2022-07): "E/S, SamplesPerSec=A", A the running average since micro-step 2.
OLD_TIMER = re.compile(r"\b(\d+)/(\d+), SamplesPerSec=" + _NUM)
_START_STEP = 2  # ThroughputTimer(start_step=2): the first two (micro-)steps are not timed
CONFIG_START = re.compile(r"DeepSpeedEngine configuration:")
_CONFIG_LINE = re.compile(r"\]\s{1,3}([A-Za-z_]\w*) (?:\.+ | )(.*)$|^\s{2}([A-Za-z_]\w*) \.+ (.*)$")
_JSON_START = re.compile(r"\bjson = (\{.*)$")
_WORLD = re.compile(r"\bdist_world_size=(\d+)")
_OVERFLOW = re.compile(r"OVERFLOW!.*Skipping step")
_PROFILER = {
    "world size:": "world_size",
    "data parallel size:": "dp",
    "model parallel size:": "mp",
    "batch size per GPU:": "micro_batch_size",
}
_FLOPS = re.compile(r"^FLOPS per GPU = .*?:\s+([\d.]+)\s*([KMGTP]?)FLOPS")
_SCALE = {"": 1e-12, "K": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3}
FLOP_CONVENTION = "DeepSpeed FLOPS profiler: (3 + recompute) x measured forward FLOPs per GPU"


def _config(b: RowBuilder, cfg: dict[str, tuple[Any, int]]) -> None:
    def has(name: str) -> bool:
        return name in cfg and cfg[name][0] is not None

    for name, col in (("train_batch_size", "global_batch_size"),
                      ("train_micro_batch_size_per_gpu", "micro_batch_size"),
                      ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                      ("zero_optimization_stage", "zero_stage"), ("world_size", "dp")):  # fmt: skip
        if has(name):
            b.put(col, cfg[name][0], cfg[name][1])
    for name, dtype in (("bfloat16_enabled", "bf16"), ("fp16_enabled", "fp16")):
        if has(name) and cfg[name][0] is True:
            b.put("dtype", dtype, cfg[name][1])
            break
    else:
        if has("fp16_enabled"):
            b.put("dtype", "fp32", cfg["fp16_enabled"][1])


def _config_json(b: RowBuilder, data: Mapping[str, Any], no: int) -> None:
    """The user's JSON (printed after the table) fills what the table lacked."""
    b.setdefault("global_batch_size", data.get("train_batch_size"), no)
    b.setdefault("micro_batch_size", data.get("train_micro_batch_size_per_gpu"), no)
    b.setdefault("zero_stage", (data.get("zero_optimization") or {}).get("stage"), no)
    if (data.get("bf16") or data.get("bfloat16") or {}).get("enabled"):
        b.setdefault("dtype", "bf16", no)
    elif (data.get("fp16") or {}).get("enabled"):
        b.setdefault("dtype", "fp16", no)


@dataclasses.dataclass
class _Scan:
    """What a pass over a DeepSpeed log collects beside the row's fields."""

    cfg: dict[str, tuple[Any, int]] = dataclasses.field(default_factory=dict)  # the table
    # the timer's samples, one list per stretch (a step count that goes back starts one)
    stretches: list[list[Sample]] = dataclasses.field(default_factory=lambda: [[]])
    seen: set[int] = dataclasses.field(default_factory=set)  # global steps of this stretch
    in_config: bool = False  # inside the engine's configuration table
    overflow: bool = False  # the next timer line follows a skipped step
    tflops: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    # the old timer's lines: line, epoch, micro-step, running average, ok; one list per stretch
    old: list[list[tuple[int, int, int, float, bool]]] = dataclasses.field(
        default_factory=lambda: [[]]
    )


def _read_json(b: RowBuilder, lines: list, i: int, text_json: str, start: int) -> int:
    """Reads the configuration's JSON from line ``start`` on, adding the following lines
    until it parses (:func:`_config_json`); returns the index of the next line to read."""
    while i < len(lines):
        try:
            _config_json(b, json.loads(text_json), start)
            break
        except json.JSONDecodeError:
            text_json += "\n" + lines[i].text
            i += 1
    return i


def _timer(scan: _Scan, m: re.Match, no: int) -> None:
    """A ``ThroughputTimer`` line: the first copy of each global step counts."""
    step = int(m.group(3))
    cur = scan.stretches[-1]
    if cur and step < cur[-1].step:
        scan.stretches.append([])
        cur, scan.seen = scan.stretches[-1], set()
    if step in scan.seen:
        return
    scan.seen.add(step)
    curr = float(m.group(5))
    # samples per second -> seconds, once the batch size is known
    cur.append(Sample(no, step, curr, 1, ok=not scan.overflow and curr > 0))
    scan.overflow = False


def _old_timer(scan: _Scan, m: re.Match, no: int) -> None:
    """A timer line from before DeepSpeed 0.7: one copy per micro-step counts."""
    epoch, micro, avg = int(m.group(1)), int(m.group(2)), float(m.group(3))
    prev = scan.old[-1][-1] if scan.old[-1] else None
    if prev and (epoch, micro) == prev[1:3]:
        return  # another host's copy
    if prev and epoch <= prev[1] and micro < prev[2]:
        scan.old.append([])  # the count went back: a restart
    scan.old[-1].append((no, epoch, micro, avg, not scan.overflow and avg > 0))
    scan.overflow = False


def _log_line(b: RowBuilder, scan: _Scan, t: str, no: int) -> None:
    """A line outside the configuration: the world size, an overflow, a timer or the FLOPS
    profiler's summary."""
    if m := _WORLD.search(t):
        b.put("num_gpus", int(m.group(1)), no)
    elif _OVERFLOW.search(t):
        scan.overflow = True
    elif m := TIMER.search(t):
        _timer(scan, m, no)
    elif m := OLD_TIMER.search(t):
        _old_timer(scan, m, no)
    else:
        stripped = t.strip()
        for label, col in _PROFILER.items():
            if stripped.startswith(label):
                b.put("profiler_" + col, parse_scalar(stripped[len(label) :]), no)
        if m := _FLOPS.search(stripped):
            scan.tflops.append((float(m.group(1)) * _SCALE[m.group(2)], no))


def _scan(b: RowBuilder, lines: list) -> _Scan:
    """One pass over the log's lines: the configuration into ``b`` and the scan's table, the
    rest by :func:`_log_line`."""
    scan = _Scan()
    i = 0
    while i < len(lines):
        ln, t = lines[i], lines[i].text
        i += 1
        if CONFIG_START.search(t):
            scan.in_config = True
        elif scan.in_config and (m := _JSON_START.search(t)):
            i = _read_json(b, lines, i, m.group(1), ln.no)
            scan.in_config = False
        elif scan.in_config and (m := _CONFIG_LINE.search(t)):
            name, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            scan.cfg[name] = (parse_scalar(value), ln.no)
        else:
            _log_line(b, scan, t, ln.no)
    return scan


def _timing(b: RowBuilder, scan: _Scan, skip_iterations: int | None, path: str):
    """The step times of every stretch, warm-up dropped, summarised."""
    gbs = b.get("global_batch_size")
    # CurrSamplesPerSec is train_batch_size over one step's time.
    timed = [
        [Sample(s.line, s.step, gbs / s.step_time_s if s.ok else float("nan"), 1, s.ok) for s in c]
        for c in scan.stretches
    ]
    if any(scan.old):
        gas = b.get("gradient_accumulation_steps") or 1
        timed += [_from_running_average(c, gbs, gas) for c in scan.old if c]
    kept, warmup = [], 0
    for times in timed:
        k, w = drop_warmup(times, skip_iterations)
        kept += k
        warmup += w
    return summarise(kept, warmup, path)


def parse(
    text: str,
    path: str,
    overrides: Mapping[str, Any],
    skip_iterations: int | None,
) -> list[dict[str, Any]]:
    """One measurement row for one DeepSpeed log (see the module docstring).

    Raises:
      AisimError: no timer line, or a field the model needs is neither in the log nor given.
    """
    b = RowBuilder(FORMAT, path)
    scan = _scan(b, clean_lines(text))
    _config(b, scan.cfg)
    if not any(scan.stretches) and not any(scan.old):
        raise AisimError(
            source=path, expected="DeepSpeed 'epoch=E/micro_step=M/global_step=G, "
            "RunningAvgSamplesPerSec=R, CurrSamplesPerSec=C' timer lines",
        )  # fmt: skip
    if b.get("profiler_world_size") is not None:
        b.setdefault("num_gpus", b.get("profiler_world_size"), b.origin["profiler_world_size"])
    b.apply(overrides)
    _derive(b)
    b.timing(_timing(b, scan, skip_iterations, path))
    if scan.tflops:
        b.put("tflops_per_gpu", scan.tflops[-1][0], scan.tflops[-1][1])
        b.values["flop_convention"] = FLOP_CONVENTION
    return [b.row()]


def _from_running_average(
    entries: list[tuple[int, int, int, float, bool]], gbs: int, gas: int
) -> list[Sample]:
    """Step times from the old timer's running averages, one program start.

    The timer reports ``A(N) = mbs·dp·(N - 2) / T(N)`` after micro-step ``N`` (``T``: time since
    micro-step 2), so between two lines ``T(N2) - T(N1) = mbs·dp·((N2-2)/A2 - (N1-2)/A1)`` and a
    step of ``gbs`` samples takes ``gbs·((N2-2)/A2 - (N1-2)/A1) / (N2 - N1)`` seconds (``mbs·dp``
    cancels). ``N`` restarts at each epoch while the average does not: lines after the first
    epoch cannot be differenced and are left out.
    """
    out: list[Sample] = []
    first_epoch = entries[0][1]
    prev: tuple[int, int, int, float, bool] | None = None
    for no, epoch, n, avg, ok in entries:
        base = prev[2] if prev is not None else _START_STEP
        micro = max(n - base, 1)
        if epoch != first_epoch or n <= _START_STEP:
            value, ok = float("nan"), False
        elif prev is None:
            value = gbs / avg
        else:
            value = gbs * ((n - 2) / avg - (prev[2] - 2) / prev[3]) / (n - prev[2])
        steps = max(round(micro / gas), 1)
        out.append(Sample(no, n // gas, value, steps, ok and (prev is None or prev[3] > 0)))
        prev = (no, epoch, n, avg, ok)
    return out


def _derive(b: RowBuilder) -> None:
    for col in ("tp", "pp"):
        b.setdefault(col, 1, "default")
    mp = b.get("profiler_mp")
    if b.get("num_gpus") is None and b.get("dp") is not None:
        if mp is not None:
            b.put("num_gpus", b.get("dp") * mp, "derived")
        else:
            b.put("num_gpus", b.get("dp") * b.get("tp") * b.get("pp"), "derived")
    b.require("num_gpus", "the number of GPUs (world size)")
    b.require("global_batch_size", "the global batch size (train_batch_size)")
    b.require("model", "the model (DeepSpeed does not print it)")
