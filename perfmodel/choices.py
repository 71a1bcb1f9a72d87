"""Named constants for the categorical knobs of a strategy (schedule, ZeRO, recompute, dtype).

Each is an :class:`enum.IntEnum`, so it is stored as a number in a strategy's array leaves and
compared with ``==`` inside ``jit`` (``s.schedule == Schedule.INTERLEAVED``). ``label`` is the
name users type and reports print; :func:`Choice.parse` reads a label or a number.
"""

from __future__ import annotations

import enum

from simbase.errors import bad_value


class Choice(enum.IntEnum):
    """An integer code with a user-facing label (the lower-case name unless overridden)."""

    @property
    def label(self) -> str:
        """The name users type and reports print (``"1f1b"``, ``"selective"``, ``"bf16"``)."""
        return _LABELS.get((type(self), int(self)), self.name.lower())

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        """Every label, in code order (index == code)."""
        return tuple(m.label for m in cls)

    @classmethod
    def parse(cls, value: object, field: str, where: str | None = None, aliases=None) -> Choice:
        """The member named by a label (any case, ``aliases`` first) or a code in range.

        Args:
          value: a member, a label, or an integral code (``2`` or ``2.0``).
          field: the argument or column that held it (named in the error).
          where: the error's source (``None``: an argument of the call).
          aliases: extra spellings -> labels (e.g. :data:`RECOMPUTE_ALIASES`).

        Returns:
          The member.

        Raises:
          AisimError: naming ``field``, the bad value and the labels.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            key = (aliases or {}).get(key, key)
            for m in cls:
                if m.label == key:
                    return m
        elif isinstance(value, int | float) and float(value).is_integer():
            try:
                return cls(int(value))
            except ValueError:
                pass
        raise bad_value(where, field, value, "one of " + ", ".join(cls.labels()))


class Schedule(Choice):
    """Pipeline schedule (Narayanan et al. SC21 §2.2)."""

    GPIPE = 0
    ONE_F_ONE_B = 1
    INTERLEAVED = 2


class ZeroStage(Choice):
    """ZeRO partitioning of model states over the data-parallel ranks (Rajbhandari et al. 2020)."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3


class Recompute(Choice):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = 0
    SELECTIVE = 1
    FULL = 2


class Dtype(Choice):
    """Compute precision of the GEMMs."""

    FP32 = 0
    TF32 = 1
    BF16 = 2
    FP16 = 3
    FP8 = 4


class MoeDispatch(Choice):
    """How routed tokens reach their experts (Megatron-Core's token dispatchers)."""

    ALLTOALL = 0
    ALLGATHER = 1
    FLEX = 2  # DeepEP/HybridEP: a token crosses to each remote NVLink domain once


class CpComm(Choice):
    """How context-parallel ranks exchange K/V (Megatron-Core's ``cp_comm_type``)."""

    P2P = 0
    ALLGATHER = 1


_LABELS = {
    (Schedule, 1): "1f1b",
    (ZeroStage, 0): "0",
    (ZeroStage, 1): "1",
    (ZeroStage, 2): "2",
    (ZeroStage, 3): "3",
}

# Recompute accepts yes/no spellings (a boolean ``grad_checkpoint`` column means full).
RECOMPUTE_ALIASES = {"true": "full", "false": "none", "yes": "full", "no": "none"}
