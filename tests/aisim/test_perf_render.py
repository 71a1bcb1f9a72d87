"""What `aisim perf` prints for people (:mod:`aisim.perf_render`): the grid's table bolds the
largest term of each row and, when narrow, hides the empty terms, then the small ones, first."""

from __future__ import annotations

import numpy as np

from aisim.perf_render import TERM_HEADERS, TOP_DROP, _drop_order, _term_cells
from perfmodel import BREAKDOWN_TERMS


def test_table_bolds_the_largest_term_of_each_row():
    rng = np.random.default_rng(1)
    for _ in range(5):
        b = dict(zip(BREAKDOWN_TERMS, rng.uniform(0, 1, len(BREAKDOWN_TERMS)), strict=True))
        cells = _term_cells(b)
        bold = [k for k, c in zip(BREAKDOWN_TERMS, cells, strict=True) if "[bold]" in c]
        assert bold == [max(b, key=b.get)]
    assert {"cp", "ep"} <= set(TERM_HEADERS.values())


def test_narrow_table_hides_empty_then_small_terms_first():
    """A MoE row whose ep term is large keeps ep after the zero terms and the smaller ones."""
    b = dict.fromkeys(BREAKDOWN_TERMS, 0.0) | dict(
        compute_s=10.0, ep_comm_s=2.0, dp_comm_exposed_s=0.5, optimizer_s=0.1
    )
    order = _drop_order([{"breakdown": b}])
    assert sorted(order) == sorted(TOP_DROP)
    zero = [TERM_HEADERS[k] for k in BREAKDOWN_TERMS if b[k] == 0]
    assert set(order[: len(zero)]) == set(zero)
    shown = [h for h in order if h in ("optim", "dp", "ep", "compute")]
    assert shown == ["optim", "dp", "ep", "compute"]  # smallest hidden first
