"""What limits a run: elasticities of the step time, and what device memory changes.

Contract: the elasticity of the step time ``t`` to a quantity ``x`` is ``∂ ln t / ∂ ln x``
(``-0.7``: 10% more ``x`` gives about 7% shorter steps), computed with ``jax.grad`` through the
cost model's one-strategy step function, for every :class:`~perfmodel.specs.hardware.HardwareSpec`
leaf that can move the step time, keyed by the hardware JSON's own field path
(``links.inter_node.bandwidth_gb_per_s``), and for every calibrated constant, keyed by its
name (``link_bandwidth_efficiency.inter_node``). A link tier's latency is read from the
constants (the loader copies ``links.<tier>.latency_us`` there, and a profile may refit it), so
``links.<tier>.latency_us`` is the elasticity to that entry. Device memory capacity only
decides feasibility (its elasticity is 0): :func:`capacity_answer` gives the smallest capacity
at which a strategy stays feasible (a bisection, equal to its ``memory_per_device_bytes`` plus
the hardware's runtime memory reserve) and
the best strategy of the grid at the standard capacity tier below and above the hardware's.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from perfmodel.plan.estimate import Estimate, estimate
from perfmodel.plan.training import DEFAULTS
from perfmodel.search.evaluate import fast_jit
from perfmodel.search.sweep import strategy_label, sweep
from perfmodel.specs.choices import Dtype
from perfmodel.specs.constants import TIER_KEYS, Constants
from perfmodel.specs.hardware import TIERS, Hardware, HardwareSpec
from perfmodel.specs.knobs import PARALLEL_DEGREES
from perfmodel.specs.strategy import strategy_from_row
from perfmodel.step.cost_models import select_step_fn
from simbase import units
from simbase.errors import AisimError

if TYPE_CHECKING:
    import pandas as pd

# the tiers of device memory (GiB as the presets spell them) the capacity what-if moves between
HBM_TIERS_GIB: tuple[float, ...] = tuple(float(x) for x in DEFAULTS["hbm_capacity_tiers_gib"])
BISECTION_STEPS = 60
# an elasticity below this moves the step time by under 0.01% per 10%: nothing binds the run
NEGLIGIBLE = 1e-3
# a hardware field path -> what a reader calls it (the "bound by" line)
PLAIN_NAMES = {
    "peak_tflops": "peak {dtype} FLOP/s (compute)",
    "memory_bandwidth_gb_per_s": "HBM bandwidth",
    "memory_capacity_gib": "HBM capacity",
    "bandwidth_gb_per_s": "{tier} bandwidth",
    "latency_us": "{tier} latency",
}
TIER_WORDS = {"intra_node": "intra-node", "inter_node": "inter-node", "wan": "wide-area"}


def _log_step_grads_impl(m, hw: HardwareSpec, c: Constants, s, step_fn):
    """``∂ ln t / ∂ hw`` and ``∂ ln t / ∂ c`` (pytrees shaped like ``hw`` and ``c``)."""
    return jax.grad(lambda h, k: jnp.log(step_fn(m, h, k, s).step_time_s), argnums=(0, 1))(hw, c)


# one strategy's programs: compiled for a fast start, as an estimate's (perfmodel.search.evaluate)
_log_step_grads = fast_jit(_log_step_grads_impl, static_argnames=("step_fn",))


def _elastic(grad, value) -> float:
    """``x · ∂ ln t / ∂ x``; 0 where ``x`` is 0 (an unused tier, no overhead)."""
    v = float(value)
    return 0.0 if v == 0.0 else float(grad) * v


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """The elasticities of one strategy's step time.

    Attributes:
      hardware: hardware field path -> elasticity.
      constants: constant name (``field`` or ``field.tier``) -> elasticity.
      bound_by: the hardware field path with the largest elasticity in magnitude (None when
        none exceeds :data:`NEGLIGIBLE`).
      bound_by_text: "this run is bound by ..." (one line).
    """

    hardware: dict[str, float]
    constants: dict[str, float]
    bound_by: str | None
    bound_by_text: str

    def to_dict(self) -> dict[str, Any]:
        """``{"elasticities": {path or name: value}, "bound_by": ..., "bound_by_text": ...}``."""
        return {
            "elasticities": {**self.hardware, **self.constants},
            "bound_by": self.bound_by,
            "bound_by_text": self.bound_by_text,
        }


def plain_name(path: str) -> str:
    """A hardware field path in words (``links.inter_node.bandwidth_gb_per_s`` ->
    ``inter-node bandwidth``)."""
    parts = path.split(".")
    if parts[0] == "peak_tflops":
        return PLAIN_NAMES["peak_tflops"].format(dtype=parts[1])
    if parts[0] == "links":
        return PLAIN_NAMES[parts[2]].format(tier=TIER_WORDS[parts[1]])
    return PLAIN_NAMES.get(path, path)


def elasticities(
    model, hardware: Hardware, constants: Constants, strategy, cost_model: str = "aisim"
) -> Sensitivity:
    """The elasticity of one strategy's step time to each hardware quantity and constant.

    Args:
      model: the :class:`~perfmodel.specs.model.Model` (or its spec).
      hardware: the :class:`Hardware`.
      constants: the constants used (a preset's or a calibrated profile's).
      strategy: one :class:`~perfmodel.specs.strategy.Strategy` (scalar leaves).
      cost_model: ``aisim`` or ``distir``.

    Returns:
      A :class:`Sensitivity`.
    """
    spec = getattr(model, "spec", model)
    hw = hardware.spec
    gh, gc = _log_step_grads(spec, hw, constants, strategy, select_step_fn(cost_model))
    dtype = Dtype(int(strategy.memory.dtype))
    out: dict[str, float] = {
        f"peak_tflops.{dtype.label}": _elastic(
            gh.peak_flops_per_s[dtype], hw.peak_flops_per_s[dtype]
        ),
        "memory_bandwidth_gb_per_s": _elastic(
            gh.memory_bandwidth_bytes_per_s, hw.memory_bandwidth_bytes_per_s
        ),
        "memory_capacity_gib": 0.0,
    }
    for i, tier in enumerate(TIERS):
        out[f"links.{tier}.bandwidth_gb_per_s"] = _elastic(
            gh.link_bandwidth_bytes_per_s[i], hw.link_bandwidth_bytes_per_s[i]
        )
        out[f"links.{tier}.latency_us"] = _elastic(
            gc.link_latency_s[i], constants.link_latency_s[i]
        )
    consts: dict[str, float] = {}
    for f in dataclasses.fields(Constants):
        if f.name == "link_latency_s":
            continue
        g, v = np.asarray(getattr(gc, f.name)), np.asarray(getattr(constants, f.name))
        if v.ndim:
            for i, tier in enumerate(TIER_KEYS):
                consts[f"{f.name}.{tier}"] = _elastic(g[i], v[i])
        else:
            consts[f.name] = _elastic(g, v)
    bound = max(out, key=lambda k: abs(out[k]))
    e = out[bound]
    if abs(e) < NEGLIGIBLE:
        # DistIR's cost model reads none of the hardware's numbers, for one
        text = f"no hardware quantity moves this run's step time (cost model {cost_model})"
        return Sensitivity(out, consts, None, text)
    text = (
        f"this run is bound by {plain_name(bound)} ({bound}): elasticity {e:+.2f}, so 10% more "
        f"changes the step time by about {100 * ((1.1) ** e - 1):+.1f}%"
    )
    return Sensitivity(out, consts, bound, text)


def _fits_impl(m, hw: HardwareSpec, c: Constants, s, capacity, step_fn):
    hw = dataclasses.replace(hw, memory_capacity_bytes=capacity)
    out = step_fn(m, hw, c, s)
    return out.fits_memory, out.memory_per_device_bytes


_fits = fast_jit(_fits_impl, static_argnames=("step_fn",))


def smallest_capacity_bytes(
    model, hardware: Hardware, constants: Constants, strategy, cost_model: str = "aisim"
) -> float:
    """The smallest device memory (bytes) at which ``strategy`` still fits, by bisection on the
    capacity (the step function's own ``fits_memory`` test); it equals the strategy's
    ``memory_per_device_bytes`` plus the hardware's runtime reserve (CUDA context, NCCL buffers,
    fragmentation) up to float32 rounding."""
    spec = getattr(model, "spec", model)
    step_fn = select_step_fn(cost_model)
    args = (spec, hardware.spec, constants, strategy)
    _, need = _fits(*args, jnp.float32(0.0), step_fn)
    lo, hi = 0.0, max(float(need) * 2.0, 1.0)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok, _ = _fits(*args, jnp.float32(mid), step_fn)
        lo, hi = (lo, mid) if bool(ok) else (mid, hi)
    return hi


def neighbour_tiers(capacity_gib: float) -> tuple[float | None, float | None]:
    """The standard capacity tiers just below and just above ``capacity_gib`` (None past the
    ends of :data:`HBM_TIERS_GIB`)."""
    below = [t for t in HBM_TIERS_GIB if t < capacity_gib - 1e-6]
    above = [t for t in HBM_TIERS_GIB if t > capacity_gib + 1e-6]
    return (below[-1] if below else None, above[0] if above else None)


@dataclasses.dataclass(frozen=True)
class CapacityAnswer:
    """What device memory changes for a run.

    Attributes:
      capacity_gib: the hardware's own capacity.
      smallest_feasible_gib: the smallest capacity at which the strategy stays feasible.
      memory_per_device_gib: the strategy's memory per device (the same number, from the model).
      tiers: ``{"lower": {...}, "higher": {...}}``: per neighbouring tier, its ``capacity_gib``
        and the grid's best strategy there (``best``; None when nothing is feasible).
    """

    capacity_gib: float
    smallest_feasible_gib: float
    memory_per_device_gib: float
    tiers: dict[str, dict[str, Any] | None]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the answer."""
        return dataclasses.asdict(self)


def capacity_answer(
    est: Estimate, constants: Constants, *, run_grid=None, **sweep_args: Any
) -> CapacityAnswer:
    """The smallest capacity at which ``est``'s strategy stays feasible, and the best strategy
    of the grid at the tier below and above the hardware's capacity.

    Args:
      est: the strategy (an :class:`Estimate`: model, hardware, strategy, cost model).
      constants: the constants it was evaluated with.
      run_grid: ``f(hardware) -> SweepResult`` for the tiers (default :func:`perfmodel.search.sweep`
        of ``est``'s model on that hardware with ``sweep_args``, top 1).
      **sweep_args: passed to :func:`perfmodel.search.sweep` (``num_gpus``, ``global_batch``, ...).
    """
    from perfmodel.search.sweep import sweep
    from simbase.errors import AisimError

    need = smallest_capacity_bytes(est.model, est.hardware, constants, est.strategy, est.cost_model)
    cap_gib = float(est.hardware.spec.memory_capacity_bytes) / units.GIB

    def grid(hw: Hardware):
        if run_grid is not None:
            return run_grid(hw)
        return sweep(
            [est.model],
            [hw],
            constants=lambda _: constants,
            cost_model=est.cost_model,
            top=1,
            **sweep_args,
        )

    tiers: dict[str, dict[str, Any] | None] = {}
    for name, tier in zip(("lower", "higher"), neighbour_tiers(cap_gib), strict=True):
        if tier is None:
            tiers[name] = None
            continue
        hw = est.hardware.replace_spec(memory_capacity_bytes=tier * units.GIB)
        try:
            best = grid(hw).best
        except AisimError:
            best = None
        tiers[name] = {"capacity_gib": tier, "best": best}
    return CapacityAnswer(
        capacity_gib=cap_gib,
        smallest_feasible_gib=need / units.GIB,
        memory_per_device_gib=float(est.breakdown.memory_per_device_bytes) / units.GIB,
        tiers=tiers,
    )


LAYOUT = PARALLEL_DEGREES
# what ``auto`` reports when the search chose the strategy (the first line shows all of it)
SEARCHED = ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "interleave", "zero_stage",
            "recompute", "sequence_parallel")  # fmt: skip


def grid_best(
    model,
    hardware,
    consts,
    num_gpus,
    global_batch,
    fixed,
    *,
    cost_model="aisim",
    stack=None,
    gpus_per_node=None,
):
    """The first row of the grid at ``num_gpus`` and ``global_batch`` with the knobs ``fixed``
    (name -> value; None: free), or None when nothing is feasible."""
    restrict = {k: [v] for k, v in fixed.items() if v is not None}
    if "gpus_per_node" in restrict:  # the grid takes one node size, not a list of them
        gpus_per_node = int(restrict.pop("gpus_per_node")[0])
    return sweep(
        [model], [hardware], num_gpus=[int(num_gpus)], global_batch=[int(global_batch)],
        constants=lambda _: consts, top=1, cost_model=cost_model, stack=stack,
        gpus_per_node=gpus_per_node, **restrict,
    ).best  # fmt: skip


def estimate_or_best(
    model, hardware, consts, knobs, given, *, cost_model="aisim", stack=None, gpus_per_node=None
) -> tuple[Estimate, bool]:
    """:func:`estimate` of ``knobs`` (the user's ``given`` over a caller's defaults, or None:
    all the user's), and False; where ``given`` has no layout and the defaults' layout is what
    fails (tp 8 x pp 8 on 8 GPUs, or a stack's FSDP over every GPU for a model that does not fit
    that way), the estimate of the grid's best strategy with ``given`` fixed (:func:`grid_best`),
    its ``auto`` naming what the search chose, and True."""
    searchable = given is not None and not set(LAYOUT) & set(given)
    try:
        per_node = {} if gpus_per_node is None else {"gpus_per_node": gpus_per_node}
        est = estimate(
            model, hardware, constants=consts, cost_model=cost_model, stack=stack,
            **per_node, **knobs,
        )  # fmt: skip
        if not searchable or bool(est.breakdown.fits_memory):
            return est, False
        failed = None
    except AisimError as e:
        if not searchable or e.field not in LAYOUT:
            raise
        failed = e
    fixed = {k: v for k, v in given.items() if k not in ("num_gpus", "global_batch_size")}
    try:
        best = grid_best(
            model, hardware, consts, knobs["num_gpus"], knobs["global_batch_size"], fixed,
            cost_model=cost_model, stack=stack, gpus_per_node=gpus_per_node,
        )  # fmt: skip
    except AisimError:
        if failed is not None:
            raise
        best = None  # no layout fits either: the defaults' estimate says by how much
    if best is None:
        if failed is None:
            return est, False
        raise failed
    est = estimate_row(best, model, hardware, consts)
    chosen = {k: best[k] for k in SEARCHED if k in best and k not in given}
    chosen = {k: v for k, v in chosen.items() if k not in ("cp", "ep") or v != 1}
    return dataclasses.replace(est, auto=est.auto | chosen), True


def estimate_row(row: dict[str, Any], m, hw: Hardware, constants: Constants) -> Estimate:
    """A sweep's result row evaluated again as one :class:`Estimate` (its whole strategy, stack
    included, and its cost model)."""
    return estimate(
        m,
        hw,
        strategy_from_row(row),
        constants=constants,
        cost_model=row.get("cost_model", "aisim"),
    )


def sensitivity_report(
    model,
    hw: Hardware,
    constants: Constants,
    *,
    num_gpus: int,
    global_batch: int,
    knobs: dict[str, Any] | None = None,
    best: bool = False,
    capacity: bool = True,
    cost_model: str = "aisim",
    gpus_per_node: int | None = None,
    stack=None,
    given: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``aisim perf sensitivity --json`` document of one strategy (``knobs``; ``given``: the
    user's part of them, as :func:`estimate_or_best` takes it), or with
    ``best`` of the best strategy of the grid at that GPU count and batch: the estimate's
    fields, ``strategy`` (its long label), ``searched``, the :func:`elasticities`
    (``elasticities``, ``bound_by``, ``bound_by_text``) and, with ``capacity``, the
    :func:`capacity_answer`."""
    common = dict(cost_model=cost_model, stack=stack, gpus_per_node=gpus_per_node)
    if best:
        row = grid_best(model, hw, constants, num_gpus, global_batch, knobs or {}, **common)
        est, searched = estimate_row(row, model, hw, constants), True
    else:
        chosen = {"num_gpus": num_gpus, "global_batch_size": global_batch, **(knobs or {})}
        est, searched = estimate_or_best(model, hw, constants, chosen, given, **common)
    doc = est.to_dict()
    doc["strategy"] = strategy_label(doc, short=False)
    doc["searched"] = searched
    doc.update(elasticities(est.model, est.hardware, constants, est.strategy, cost_model).to_dict())
    if capacity:
        answer = capacity_answer(
            est, constants, num_gpus=[num_gpus], global_batch=[global_batch],
            gpus_per_node=gpus_per_node,
        )  # fmt: skip
        doc["capacity"] = answer.to_dict()
    return doc


def elasticity_table(doc: dict[str, Any]) -> pd.DataFrame:
    """A sensitivity document's elasticities as a table (``aisim perf sensitivity --out``): one
    row per ``quantity`` with its ``elasticity``, in the document's order."""
    import pandas as pd

    return pd.DataFrame(doc["elasticities"].items(), columns=["quantity", "elasticity"])
