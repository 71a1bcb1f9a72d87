"""Cross-site collaborative training efficiency: the public API.

A few sites, each with its own hardware, devices and data, train one model together over WAN
links, through a parameter server or in a ring (modes ``fedavg``, ``data-parallel``,
``pipeline``). For each site and round the model gives the seconds and the shares of compute,
communication (including waiting), serialisation and other work. Three layers:

- the model (:mod:`perfmodel.collab_model`): pure and jittable, one ``jit(vmap)`` over model
  sizes: :class:`Site`, :class:`Aggregator`, :class:`Setup`, :func:`round_timeline`,
  :func:`sweep`, :class:`RoundTimeline`;
- scenarios (:mod:`perfmodel.collab_scenario`): validated Python values to the model's pytrees
  and to tables: :class:`Scenario`, :func:`make_site`, :func:`make_aggregator`,
  :func:`make_setup`, :func:`scenario_parts`, :func:`size_models`, :func:`sweep_frame`,
  :func:`timeline_frame`;
- text (:mod:`perfmodel.collab_text`): :func:`scenario_from_text` and :func:`parse_sizes` for
  settings typed as words (``"1Gbps"``, ``"10M,100M"``).

Real models across sites (each site a cluster timed by :func:`perfmodel.estimate`, DiLoCo-style
rounds): :class:`CrossSite`, :func:`evaluate`, :func:`cross_site_frame`,
:func:`pipeline_frame` (:mod:`perfmodel.collab_real`)
over the jittable round model :class:`SiteRate`, :class:`WanRound`, :func:`cross_site_round`,
:func:`round_grid` (:mod:`perfmodel.collab_sites`; modes in :data:`ROUND_MODES`).

Fitting the constants to measured shares is :func:`calibration.fit_collab`; measuring
serialisation throughput is :func:`calibration.serde.measure_serde`.

Example::

    from perfmodel import collab, load_hardware

    sc = collab.Scenario(hardware=(load_hardware("a100-80gb"),) * 2,
                         aggregator=load_hardware("cpu-host"))
    df = collab.sweep_frame(sc, ["10M", "100M"], rounds=60)
"""

from perfmodel.collab_model import (
    COMPRESSIONS,
    MODES,
    SERDE_FORMATS,
    SHARE_TERMS,
    TOPOLOGIES,
    WAN,
    Aggregator,
    RoundTimeline,
    Setup,
    Site,
    local_step_s,
    payload_bytes,
    round_timeline,
    stack,
    sweep,
)
from perfmodel.collab_real import (
    CrossSite,
    CrossSiteResult,
    cross_site_frame,
    evaluate,
    inner_step_times,
    make_round,
    pipeline_frame,
    site_rates,
)
from perfmodel.collab_scenario import (
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
from perfmodel.collab_sites import (
    PAYLOAD_BYTES,
    ROUND_MODES,
    SYNC_TOPOLOGIES,
    CrossSiteRound,
    SiteRate,
    WanRound,
    cross_site_round,
    round_grid,
)
from perfmodel.collab_text import parse_sizes, scenario_from_text

__all__ = [
    # choices
    "MODES",
    "TOPOLOGIES",
    "COMPRESSIONS",
    "SERDE_FORMATS",
    "SHARE_TERMS",
    "WAN",
    # the model (jittable)
    "Site",
    "Aggregator",
    "Setup",
    "RoundTimeline",
    "payload_bytes",
    "local_step_s",
    "round_timeline",
    "sweep",
    "stack",
    # scenarios
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
    # text
    "scenario_from_text",
    "parse_sizes",
    # real models across sites
    "ROUND_MODES",
    "SYNC_TOPOLOGIES",
    "PAYLOAD_BYTES",
    "SiteRate",
    "WanRound",
    "CrossSiteRound",
    "cross_site_round",
    "round_grid",
    "CrossSite",
    "CrossSiteResult",
    "evaluate",
    "inner_step_times",
    "cross_site_frame",
    "site_rates",
    "make_round",
    "pipeline_frame",
]
