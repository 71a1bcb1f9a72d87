"""The free constants of a fit as a PyTree of unconstrained raw values.

Contract: a :class:`Parameterization` names the free entries of
:class:`perfmodel.specs.constants.Constants` (a field, one tier of a per-tier field, or the shorthand
``efficiency``) and maps a dict of raw scalars (any real number) to a full ``Constants``, the
other entries staying at the preset's values. Fractions (efficiencies, the DP overlap) pass
through a sigmoid, so they stay in (0, 1); positive quantities (half-sizes, overheads, latencies,
the optimizer factor) through a scaled softplus, so they stay > 0. The raw value 0 is never
special: :meth:`Parameterization.init` returns the raw values of the preset itself, so an
unfitted parameterization reproduces the preset exactly (up to float32 rounding).

``efficiency`` is one overall efficiency: a single shift ``δ`` added to the logits of every
throughput efficiency (matmul and memory-bound maxima, and the link bandwidth efficiency of each
tier), ``η_i = sigmoid(logit(η_i⁰) + δ)``. It is the one knob to free when a single measured row
is all there is (the Colossal-AI comparison): it scales the whole step, whatever dominates it.
``compute_efficiency`` is the same shift on the matmul and memory-bound maxima only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from perfmodel.specs.constants import TIER_KEYS, Constants
from simbase.errors import bad_value, suggest
from simbase.parse import split_list

# field -> (transform, scale of a softplus field in SI units: a typical magnitude, used so that a
# raw step of 1 is a relative change of order 1 whatever the units)
FIELDS: dict[str, tuple[str, float]] = {
    "matmul_efficiency_max": ("sigmoid", 1.0),
    "matmul_half_flops": ("softplus", 1e9),
    "memory_efficiency_max": ("sigmoid", 1.0),
    "memory_half_bytes": ("softplus", 1e6),
    "kernel_overhead_s": ("softplus", 1e-5),
    "link_bandwidth_efficiency": ("sigmoid", 1.0),
    "link_latency_s": ("softplus", 1e-5),
    "dp_overlap_fraction": ("sigmoid", 1.0),
    "microbatch_overhead_s": ("softplus", 1e-3),
    "optimizer_time_factor": ("softplus", 1.0),
    "fp8_matmul_efficiency_ratio": ("sigmoid", 1.0),
    "attention_efficiency_ratio": ("sigmoid", 1.0),
    "tp_overlap_fraction": ("sigmoid", 1.0),
    "moe_layer_overhead_s": ("softplus", 1e-3),
    "step_overhead_s": ("softplus", 1e-3),
    "fabric_congestion": ("softplus", 0.1),
    "fp8_block_scaled_gemm_ratio": ("sigmoid", 1.0),
    "fp4_matmul_efficiency_ratio": ("sigmoid", 1.0),
    "wave_quantization_weight": ("sigmoid", 1.0),
}
PER_TIER = ("link_bandwidth_efficiency", "link_latency_s")
# shorthand -> the sigmoid entries whose logits one shared shift moves
GROUPS: dict[str, tuple[str, ...]] = {
    "efficiency": (
        "matmul_efficiency_max",
        "memory_efficiency_max",
        *(f"link_bandwidth_efficiency.{t}" for t in TIER_KEYS),
    ),
    "compute_efficiency": ("matmul_efficiency_max", "memory_efficiency_max"),
}
# what a fit frees when no names are given
DEFAULT_FREE = (
    "matmul_efficiency_max",
    "matmul_half_flops",
    "memory_efficiency_max",
    "kernel_overhead_s",
    "microbatch_overhead_s",
)
_EPS = 1e-6


def entry_names() -> list[str]:
    """Every entry name :func:`parse_free` accepts: fields, ``field.tier`` entries, shorthands."""
    names = list(FIELDS)
    names += [f"{f}.{t}" for f in PER_TIER for t in TIER_KEYS]
    return names + list(GROUPS)


def _split(name: str) -> tuple[str, int | None]:
    field, _, tier = name.partition(".")
    return field, (TIER_KEYS.index(tier) if tier else None)


@dataclasses.dataclass(frozen=True)
class Parameterization:
    """Free entries of the constants over a preset's values (``base``).

    Attributes:
      base: the preset's constants (the values of every entry that is not free, and the prior).
      free: entry names in a fixed order (fields, ``field.tier`` or a shorthand of :data:`GROUPS`).
    """

    base: Constants
    free: tuple[str, ...]

    def _base_value(self, entry: str) -> jax.Array:
        field, tier = _split(entry)
        v = jnp.asarray(getattr(self.base, field), jnp.float32)
        return v if tier is None else v[tier]

    def _scale(self, entry: str) -> jax.Array:
        field, _ = _split(entry)
        # a zero preset value (no per-microbatch overhead) would make the scale degenerate
        return jnp.maximum(self._base_value(entry), FIELDS[field][1] * 1e-3)

    def init(self) -> dict[str, jax.Array]:
        """Raw values that reproduce the preset (the starting point and the prior's centre).

        Traceable: ``base`` may hold tracers (the fit compiles once per set of free names).
        """
        raw = {}
        for entry in self.free:
            if entry in GROUPS:
                raw[entry] = jnp.zeros((), jnp.float32)
                continue
            field, _ = _split(entry)
            v = self._base_value(entry)
            if FIELDS[field][0] == "sigmoid":
                p = jnp.clip(v, _EPS, 1.0 - _EPS)
                raw[entry] = jnp.log(p) - jnp.log1p(-p)
            else:
                y = jnp.maximum(v / self._scale(entry), _EPS)
                raw[entry] = jnp.where(y < 30.0, y + jnp.log(-jnp.expm1(-jnp.minimum(y, 30.0))), y)
        return raw

    def constants(self, raw: dict[str, jax.Array]) -> Constants:
        """The physical constants of raw values (differentiable; free entries replaced)."""
        values = {
            f.name: jnp.asarray(getattr(self.base, f.name), jnp.float32)
            for f in dataclasses.fields(Constants)
        }
        shifts: dict[str, jax.Array] = {}
        for entry in self.free:
            if entry in GROUPS:
                for member in GROUPS[entry]:
                    shifts[member] = shifts.get(member, 0.0) + raw[entry]
        for entry in self.free:
            if entry in GROUPS:
                continue
            field, tier = _split(entry)
            if FIELDS[field][0] == "sigmoid":
                x = jax.nn.sigmoid(raw[entry])
            else:
                x = self._scale(entry) * jax.nn.softplus(raw[entry])
            values[field] = x if tier is None else values[field].at[tier].set(x)
        for member, delta in shifts.items():
            field, tier = _split(member)
            current = values[field] if tier is None else values[field][tier]
            p = jnp.clip(current, _EPS, 1.0 - _EPS)
            x = jax.nn.sigmoid(jnp.log(p) - jnp.log1p(-p) + delta)
            values[field] = x if tier is None else values[field].at[tier].set(x)
        return Constants(**values)

    def physical(self, raw: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The value of each free entry (a shorthand reports its shift ``δ`` in logit units)."""
        c = self.constants(raw)
        out = {}
        for entry in self.free:
            if entry in GROUPS:
                out[entry] = raw[entry]
                continue
            field, tier = _split(entry)
            v = getattr(c, field)
            out[entry] = v if tier is None else v[tier]
        return out


def parse_free(text: str | list[str] | None, base: Constants) -> Parameterization:
    """Names of the constants to free -> a :class:`Parameterization` over ``base``.

    Args:
      text: comma-separated entry names (or a list of such strings); ``None`` or empty frees
        :data:`DEFAULT_FREE`. A per-tier field name frees all its tiers; ``field.tier`` frees one.
      base: the preset's constants.

    Raises:
      AisimError: ``field`` ``free``: an unknown name (with a suggestion), a name given twice,
        or no name at all.
    """
    if not text:
        return Parameterization(base=base, free=DEFAULT_FREE)
    names = [n.lower() for n in split_list(text) or []]
    valid = entry_names()
    entries: list[str] = []
    for n in names:
        if n not in valid:
            raise bad_value(
                None,
                "free",
                n,
                f"comma-separated constants from: {', '.join(valid)}{suggest(n, valid)}",
            )
        expanded = [f"{n}.{t}" for t in TIER_KEYS] if n in PER_TIER else [n]
        for e in expanded:
            if e in entries:
                raise bad_value(None, "free", text, f"each constant once ({e} is named twice)")
            entries.append(e)
    if not entries:
        raise bad_value(None, "free", text, "at least one constant name")
    return Parameterization(base=base, free=tuple(entries))
