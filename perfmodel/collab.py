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
]
