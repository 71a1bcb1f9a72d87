"""The data types of one federated round, shared by the round (:mod:`fl.round`), its cohort
training (:mod:`fl.cohort`), FedBuff (:mod:`fl.asynchronous`) and personalization.

Contract: :class:`RoundSpec` is the static description of a round (hashable, closed over by
``jit``); :class:`ServerState`, :class:`RoundInputs`, :class:`Hyper`, :class:`CohortPlan` and
:class:`RoundMetrics` are registered dataclasses whose leaves are arrays. No functions beyond
properties live here, so every module of the engine can import it without a circle.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int

from fl import local_update as lu
from fl.server import Algorithm
from fl.systems import Systems


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ServerState:
    """Global model, server optimiser state, SCAFFOLD controls, DP clip norm, round counter and
    simulated clock.

    ``client_controls`` has a leading ``[clients]`` axis (the whole population) or is ``None``;
    ``clip_norm`` is DP-FedAvg's current clip norm (it moves only with adaptive clipping);
    ``clock_s`` is the simulated time at which the next round starts (a trace's availability
    depends on it).
    """

    params: object
    opt_state: object
    control: object
    client_controls: object
    clip_norm: Float[Array, ""]
    round: Int[Array, ""]
    key: Array
    clock_s: Float[Array, ""] = 0.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundInputs:
    """Device-resident data of a run: pool, population and per-client systems."""

    data: lu.LocalData
    starts: Int[Array, " clients"]
    sizes: Int[Array, " clients"]
    systems: Systems


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Hyper:
    """Numbers of a run that one might sweep (array leaves)."""

    mu: Float[Array, ""]
    client_lr: Float[Array, ""]
    straggler_fraction: Float[Array, ""]
    deadline_s: Float[Array, ""]
    clip_norm: Float[Array, ""]
    noise_multiplier: Float[Array, ""]
    max_local_steps: Int[Array, ""]
    clip_quantile: Float[Array, ""] = 0.5
    clip_lr: Float[Array, ""] = 0.2
    clip_count_stddev: Float[Array, ""] = 0.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundMetrics:
    """What one round did."""

    clients_sampled: Int[Array, ""]
    clients_kept: Int[Array, ""]
    round_time_s: Float[Array, ""]
    bytes_up: Float[Array, ""]
    bytes_down: Float[Array, ""]
    local_loss: Float[Array, ""]
    finite: Array
    clip_norm: Float[Array, ""]


@dataclasses.dataclass(frozen=True)
class RoundSpec:
    """Static shape and mode choices of a round."""

    local: lu.LocalSpec
    algorithm: Algorithm
    cohort: int
    chunk: int
    sampling: str = "uniform"
    adaptive_clip: bool = False
    flops_per_sample: float = 0.0
    param_bytes: float = 0.0
    mesh: Mesh | None = None
    head: bool = True  # the growing head of :attr:`segments` (fl.build.head_pays decides)
    fast_compile: bool = False  # XLA:CPU's fast options (fl.build.round_compile_options decides)

    @property
    def unit(self) -> int:
        """Chunk sizes are multiples of this (the number of devices the client axis spans)."""
        return 1 if self.mesh is None else int(self.mesh.devices.size)

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """``(chunk clients, number of chunks)`` groups covering the size-sorted cohort in order:
        with :attr:`head`, single chunks of ``unit, 4 unit, 16 unit, ...`` (below ``chunk``) first,
        then the rest split evenly into chunks of at most ``chunk`` clients (padded to a multiple
        of ``unit``). Each group is a loop of its own in the compiled round."""
        u, groups, covered, size = self.unit, [], 0, self.unit
        while self.head and size < self.chunk and covered + size < self.cohort:
            groups.append((size, 1))
            covered += size
            size *= 4
        rest = self.cohort - covered
        if rest > 0:
            count = -(-rest // self.chunk)
            per = -(-rest // count)
            groups.append((-(-per // u) * u, count))
        return tuple(groups)

    @property
    def slots(self) -> int:
        """Client slots of all chunks (the cohort plus padding)."""
        return sum(size * count for size, count in self.segments)

    @property
    def payload_bytes(self) -> float:
        """Bytes each way per client: the model, plus SCAFFOLD's control variate."""
        return (2.0 if self.algorithm.scaffold else 1.0) * self.param_bytes


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CohortPlan:
    """Who trains this round and how much (all ``[cohort]``), and the round's time."""

    ids: Int[Array, " cohort"]
    n: Int[Array, " cohort"]
    steps: Int[Array, " cohort"]
    weight: Float[Array, " cohort"]
    kept: Array
    available: Array
    contacted: Array
    round_time_s: Float[Array, ""]
    train_key: Array
    noise_key: Array
