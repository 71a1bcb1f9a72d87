"""Which framework wrote a log: :func:`detect_format`.

Contract: a log's format is decided by the lines that carry its measurement, checked in this
order, because one log can hold several frameworks' lines (Megatron-DeepSpeed prints both
Megatron's iteration lines and DeepSpeed's configuration; Colossal-AI's legacy trainer runs under
the ``deepspeed`` launcher): Megatron ``iteration N/M | ... elapsed time per iteration (ms)``,
torchtitan ``step: N  loss: ...  tps:``, DeepSpeed's ``RunningAvgSamplesPerSec=`` timer, then
Colossal-AI (``Step time:`` with ``args: Namespace(``, ``Throughput: X samples/sec``,
``sample_per_sec``, ``[Epoch N / Train]``). When no measurement line is found, the start-up
banners decide (Megatron's ``arguments`` block, ``[titan]``, ``DeepSpeedEngine configuration``,
``Namespace(``), so that the importer can say what is missing.
"""

from __future__ import annotations

import re

from calibration.logs import colossal_bench, deepspeed, megatron, torchtitan
from calibration.logs.rows import strip_ansi
from simbase.errors import AisimError

FORMATS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed", "colossal")

_MEASURED = (
    ("megatron", re.compile(r"\biteration\s+\d+/\s*\d+\s*\|.*elapsed time per iteration")),
    ("torchtitan", torchtitan.STEP),
    ("deepspeed", deepspeed.TIMER),
    ("deepspeed", deepspeed.OLD_TIMER),
    (
        "colossal",
        re.compile(
            r"\bStep time:|Throughput:\s*[\d.]+\s*samples/sec|sample_per_sec"
            r"|\[Epoch \d+ / Train\]"
        ),
    ),  # fmt: skip
)
_BANNERS = (
    ("megatron", megatron.ARGS_START),
    ("torchtitan", re.compile(r"\[titan\]")),
    ("deepspeed", deepspeed.CONFIG_START),
    ("colossal", colossal_bench.NAMESPACE),
)


def detect_format(text: str, source: str | None = None) -> str:
    """The format of a log: one of :data:`FORMATS`.

    Args:
      text: the log (ANSI colours and launcher prefixes are fine).
      source: the file name, for the error.

    Raises:
      AisimError: (``field='format'``) no line of a known framework.
    """
    text = strip_ansi(text)
    for table in (_MEASURED, _BANNERS):
        for name, pattern in table:
            if pattern.search(text):
                return name
    raise AisimError(
        source=source, field="format", value="auto",
        expected=f"a log of {', '.join(FORMATS)} (no line of theirs found)",
        hint="name the format with {format}",
    )  # fmt: skip
