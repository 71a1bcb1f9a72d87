"""Cross-site collaborative training efficiency: the public API.

A few sites, each with its own hardware, devices and data, train one model together over WAN
links, through a parameter server or in a ring (modes ``fedavg``, ``diloco``,
``streaming-diloco``, ``data-parallel``, ``pipeline``). For each site and round the model gives
the seconds and shares of compute, communication, serialisation, other work (aggregation) and
idle time, and two utilisations: ``compute_utilization`` (compute / wall time) and
``compute_share_of_busy`` (compute / the time not idle, as published runs report it).

- **The round model** (:mod:`collab.round_model`, pure and jittable): :class:`SiteWork`,
  :class:`PipelineStage`, :class:`Exchange` -> :func:`collab_round` -> :class:`Round`;
  :func:`round_grid` is its one ``jit(vmap)`` over settings.
- **Model sizes** (the standard MLPs, timed inside ``jit``; :mod:`collab.scenario_model` and
  :mod:`collab.scenario`): :class:`Site`, :class:`Aggregator`, :class:`Setup`,
  :func:`round_timeline`, :func:`sweep` (one ``jit(vmap)`` over sizes); from Python values
  :class:`Scenario`, :func:`make_site`, :func:`make_aggregator`, :func:`make_setup`,
  :func:`scenario_parts`, :func:`size_models`, :func:`sweep_frame`, :func:`timeline_frame`.
- **Real models across sites** (each site a cluster timed by :func:`perfmodel.estimate`;
  :mod:`collab.cross_site`): :class:`CrossSite`, :func:`evaluate`, :func:`cross_site_frame`.
- **Text** (:mod:`collab.settings`): the words people type (``"1Gbps"``, ``"10M,100M"``) to a
  :class:`Scenario` or a :class:`CrossSite`; :func:`run_sweep` is ``aisim collab sweep``.
- **Fitting**: :func:`fit_collab` fits the constants to a table of shares, and
  :func:`validate_crosssite` compares published cross-site runs (:mod:`collab.fit`);
  :func:`collab.serialisation.measure_serde` measures serialisation throughput.

Example::

    import collab
    from perfmodel import load_hardware

    sc = collab.Scenario(hardware=(load_hardware("a100-80gb"),) * 2,
                         aggregator=load_hardware("cpu-host"))
    df = collab.sweep_frame(sc, ["10M", "100M"], rounds=60)
"""

from collab.cross_site import (
    CrossSite,
    CrossSiteResult,
    cross_site_frame,
    evaluate,
    inner_step_times,
    make_exchange,
    site_estimates,
    site_work,
)
from collab.fit import CollabFit, fit_collab, fit_from_text, load_collab_table
from collab.published import CrossSiteValidation, load_crosssite_runs, validate_crosssite
from collab.round_model import (
    PAYLOAD_BYTES,
    ROUND_MODES,
    SYNC_TOPOLOGIES,
    Exchange,
    PipelineStage,
    Round,
    SiteWork,
    collab_round,
    payload_bytes,
    round_grid,
    stack,
)
from collab.scenario import (
    SERDE_DEFAULT_BYTES_PER_S,
    Scenario,
    make_aggregator,
    make_setup,
    make_site,
    scenario_parts,
    scenario_sites,
    size_models,
    sweep_frame,
    timeline_frame,
)
from collab.scenario_model import (
    COMPRESSIONS,
    MODES,
    SERDE_FORMATS,
    SHARE_TERMS,
    TOPOLOGIES,
    WAN,
    Aggregator,
    Setup,
    Site,
    local_step_s,
    round_timeline,
    source_shares,
    sweep,
)
from collab.settings import cross_site_from_text, parse_sizes, scenario_from_text
from collab.sweeps import SweepResult, run_sweep

__all__ = [
    # the round model (jittable)
    "ROUND_MODES",
    "SYNC_TOPOLOGIES",
    "PAYLOAD_BYTES",
    "SiteWork",
    "PipelineStage",
    "Exchange",
    "Round",
    "collab_round",
    "round_grid",
    "payload_bytes",
    "stack",
    # model sizes
    "MODES",
    "TOPOLOGIES",
    "COMPRESSIONS",
    "SERDE_FORMATS",
    "SHARE_TERMS",
    "WAN",
    "Site",
    "Aggregator",
    "Setup",
    "local_step_s",
    "round_timeline",
    "source_shares",
    "sweep",
    "SERDE_DEFAULT_BYTES_PER_S",
    "Scenario",
    "make_site",
    "make_aggregator",
    "make_setup",
    "scenario_sites",
    "scenario_parts",
    "size_models",
    "timeline_frame",
    "sweep_frame",
    # real models across sites
    "CrossSite",
    "CrossSiteResult",
    "site_estimates",
    "site_work",
    "make_exchange",
    "inner_step_times",
    "evaluate",
    "cross_site_frame",
    # text
    "scenario_from_text",
    "cross_site_from_text",
    "parse_sizes",
    "run_sweep",
    "SweepResult",
    # fitting and published runs
    "CollabFit",
    "fit_collab",
    "fit_from_text",
    "load_collab_table",
    "CrossSiteValidation",
    "load_crosssite_runs",
    "validate_crosssite",
]
