"""Constants per software stack and hardware preset, fitted to the published runs, and their
error measured on runs each fit has not seen.

Contract: :func:`fit_stacks` fits the constants of every stack (the stack file's name, variants
pooled: ``megatron-core@nemo`` runs count for ``megatron-core``) on every hardware preset it has
at least :data:`MIN_ROWS` published runs on (:mod:`calibration.public_runs`), and predicts every
run three more ways:

- **uncalibrated**: the hardware preset's constants;
- **leave one row out**: the pair's fit without the row;
- **leave one source out**: every fit made again without the row's source document (a source
  can span several pairs: llm-foundry's table is all of ``pytorch-fsdp``'s runs), and the row
  predicted as :func:`perfmodel.plan.stack_constants.stack_constants` would predict it then: by
  its pair's fit where other sources remain, else carried over from the stack's other fitted
  hardware, else the hardware preset's constants. This is the error a planner sees on a run of
  another cluster, year or benchmark.

The fitted constants carry two variances into the stack file: the between-source scatter (the
pooled log residuals of rows predicted by their own pair's fit without their source) for fitted
pairs, and the carried-over scatter (each fitted pair predicted from the stack's other pairs) for
hardware without runs. :func:`coverage` counts how many of each source's rows fall inside their
90% interval when the source is left out.

Run ``python -m calibration.stacks --write`` to refit and rewrite the ``constants`` blocks of
``perfmodel/profiles/stacks/*.json``; without ``--write`` it prints the tables only.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from calibration.public_runs import MAIN_CSV, PublishedRun, load_published_runs
from calibration.rows import RowConfig, build_batch
from perfmodel.plan.stack_constants import CARRIED, FRACTION_FIELDS, stack_constants
from perfmodel.plan.uncertainty import (
    DEFAULT_LEVEL,
    ConstantsCovariance,
    entry_values,
    t_quantile,
    with_entries,
)
from perfmodel.search.evaluate import fast_jit
from perfmodel.specs.stack_preset import load_stack
from perfmodel.step.step_time import step_time
from simbase.io import atomic_write_text

MIN_ROWS = 4  # fewer runs than this on a pair: its constants are carried over
# the constants a stack's fit frees: the GEMM and attention efficiencies (what its kernels reach),
# the per-kernel and per-step host costs (what its launches and loop cost); with few runs, the
# GEMM efficiency alone
FREE = (
    "matmul_efficiency_max",
    "attention_efficiency_ratio",
    "kernel_overhead_s",
    "step_overhead_s",
)
FREE_FEW = ("matmul_efficiency_max",)
FEW_ROWS = 12
# the pull of each free constant towards the hardware preset's value, in units of one row's
# squared log error per squared logit (or log) unit: weak, it decides only what the rows cannot
PRIOR = 0.02
# kernel efficiency ratios are known to about one logit unit from kernel benchmarks (FlashAttention
# and cuDNN attention reach 0.4-0.75 of a GEMM's efficiency, FP8 GEMMs 0.7-0.9 of their doubled
# peak): a fit that moves them further is compensating for a cost the model does not have
PRIOR_RATIO = {"attention_efficiency_ratio": 0.2, "fp8_matmul_efficiency_ratio": 0.2}
# beyond this log error a run counts linearly, not squared (Huber): one source's outliers (a
# recipe the model misses by 40%) must not move a pair's constants for every other run
HUBER = 0.1
ITERATIONS = 60


def stack_name(run: PublishedRun) -> str:
    """The stack file a run's constants belong to (variants pooled)."""
    return run.stack.partition("@")[0]


def _to_z(entries: tuple[str, ...], x: np.ndarray) -> np.ndarray:
    """Constants' values (SI) -> unconstrained values: logit for fractions, log otherwise."""
    out = []
    for e, v in zip(entries, np.asarray(x, float), strict=True):
        if e.partition(".")[0] in FRACTION_FIELDS:
            v = min(max(v, 1e-6), 1 - 1e-6)
            out.append(math.log(v / (1 - v)))
        else:
            out.append(math.log(max(v, 1e-30)))
    return np.array(out)


def _from_z(entries: tuple[str, ...], z):
    return jnp.stack(
        [
            jax.nn.sigmoid(z[i]) if e.partition(".")[0] in FRACTION_FIELDS else jnp.exp(z[i])
            for i, e in enumerate(entries)
        ]
    )


def _dx_dz(entries: tuple[str, ...], x: np.ndarray) -> np.ndarray:
    return np.array(
        [
            v * (1 - v) if e.partition(".")[0] in FRACTION_FIELDS else v
            for e, v in zip(entries, x, strict=False)
        ]
    )


@functools.cache
def _program(entries: tuple[str, ...]):
    """log step time and its gradient in the unconstrained values of ``entries``, for a group of
    rows (one small forward-mode program per group, compiled fast: no reverse pass)."""

    def one(m, hw, c, s, z):
        def log_t(z):
            cz = with_entries(c, entries, _from_z(entries, z))
            return jnp.log(step_time(m, hw, cz, s).step_time_s)

        def value_and_log_t(z):
            v = log_t(z)
            return v, v

        jac, value = jax.jacfwd(value_and_log_t, has_aux=True)(z)  # one trace of the step
        return value, jac

    vm = jax.vmap(one, in_axes=(0, None, None, 0, None))
    return fast_jit(vm)


@dataclasses.dataclass
class Pair:
    """The runs of one stack on one hardware preset, and their fit (Gauss-Newton on the log
    step times of the runs, a weak prior on the preset's values)."""

    stack: str
    hardware: str
    idx: list[int]
    entries: tuple[str, ...]
    batch: Any
    measured: np.ndarray
    base: Any  # the hardware preset's constants
    z0: np.ndarray = None
    z: np.ndarray = None
    covariance: ConstantsCovariance | None = None

    def __post_init__(self):
        self.z0 = _to_z(self.entries, np.asarray(entry_values(self.base, self.entries)))

    def log_t(self, z, c=None) -> tuple[np.ndarray, np.ndarray]:
        """Every run's log step time and its Jacobian ``(n, p)`` at ``z`` (over ``c``, default
        the preset's constants)."""
        prog = _program(self.entries)
        c = self.base if c is None else c
        vals, jacs = [], []
        zj = jnp.asarray(z, jnp.float32)
        for g in self.batch.groups:
            v, j = prog(g.model, g.hw, c, g.strategy, zj)
            vals.append(np.asarray(v, float))
            jacs.append(np.asarray(j, float))
        order = self.batch.order
        return np.concatenate(vals)[order], np.concatenate(jacs)[order]

    def predicted(self, z=None, c=None) -> np.ndarray:
        """Seconds per step with the entries at ``z`` (default: the fit)."""
        return np.exp(self.log_t(self.z if z is None else z, c)[0])

    def values(self, z=None) -> dict[str, float]:
        """The fitted entries in SI units."""
        x = np.asarray(_from_z(self.entries, jnp.asarray(self.z if z is None else z)), float)
        return {e: float(v) for e, v in zip(self.entries, x, strict=True)}


def _pairs(runs: list[PublishedRun]) -> dict[tuple[str, str], Pair]:
    """The fitted units: every stack on every hardware, its versions pooled (``megatron-core``
    on ``gb200``: NeMo's and Megatron-Bridge's runs), and every version with runs of its own
    that are not all of the pooled pair's (``megatron-core@nemo`` on ``gb200``)."""
    by: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(runs):
        by.setdefault((stack_name(r), r.hardware.name), []).append(i)
        if "@" in r.stack:
            by.setdefault((r.stack, r.hardware.name), []).append(i)
    out = {}
    for (st, hw), idx in sorted(by.items()):
        pooled = by[(st.partition("@")[0], hw)]
        if len(idx) < MIN_ROWS or ("@" in st and len(idx) == len(pooled)):
            continue
        sel = [runs[i] for i in idx]
        batch = build_batch(
            [RowConfig(model=r.model, hardware=r.hardware, knobs={}, where=r.label) for r in sel],
            [r.strategy for r in sel],
        )
        entries = FREE if len(idx) >= FEW_ROWS else FREE_FEW
        if sum(r.group == "moe" for r in sel) >= MIN_ROWS:
            entries += ("moe_layer_overhead_s",)  # the dispatcher's host syncs (the stack's)
        n_fp8 = sum(bool(r.fp8) for r in sel)
        if len(idx) >= FEW_ROWS and min(n_fp8, len(sel) - n_fp8) >= MIN_ROWS:
            # FP8 and 16-bit runs on the pair: what its FP8 GEMMs reach is measured, so it
            # is not left to the other constants to absorb (the device's, per stack)
            entries += ("fp8_matmul_efficiency_ratio",)
        measured = np.array([r.measured_step_s for r in sel])
        out[(st, hw)] = Pair(st, hw, idx, entries, batch, measured, sel[0].hardware.constants)
    return out


def _units(run: PublishedRun, pairs: dict) -> list[tuple[str, str]]:
    """The pairs that may predict a run, the most specific first (its version's, the stack's)."""
    keys = [(run.stack, run.hardware.name), (stack_name(run), run.hardware.name)]
    return [k for k in dict.fromkeys(keys) if k in pairs]


def _prior(pair: Pair, rows: int) -> np.ndarray:
    """Each entry's prior weight: :data:`PRIOR` (:data:`PRIOR_RATIO` for kernel efficiency
    ratios), or held at the preset's value (a large weight)
    for the entries beyond :data:`FREE_FEW` when fewer than :data:`FEW_ROWS` rows are fitted."""
    few = rows < FEW_ROWS
    held = [few and e not in FREE_FEW and e != "moe_layer_overhead_s" for e in pair.entries]
    return np.array(
        [1e6 if h else PRIOR_RATIO.get(e, PRIOR) for e, h in zip(pair.entries, held, strict=True)]
    )


def _solve(pair: Pair, w: np.ndarray) -> np.ndarray | None:
    """Levenberg-Marquardt on the weighted log errors (squared up to :data:`HUBER`, linear
    beyond) plus the prior; None when fewer than :data:`MIN_ROWS` rows have weight."""
    rows = int((w > 0).sum())
    if rows < MIN_ROWS:
        return None
    log_m = np.log(pair.measured)
    z0, z, damping = pair.z0, pair.z0.copy(), 1e-2
    prior = _prior(pair, rows)

    def loss(z, t):
        a = np.abs(t - log_m)
        rho = np.where(a <= HUBER, a**2, 2 * HUBER * a - HUBER**2)
        return float(np.sum(w * rho) + np.sum(prior * (z - z0) ** 2))

    t, jac = pair.log_t(z)
    cur = loss(z, t)
    for _ in range(ITERATIONS):
        # iteratively reweighted: the Huber loss's Gauss-Newton step
        u = w * np.minimum(1.0, HUBER / np.maximum(np.abs(t - log_m), 1e-12))
        h = jac.T @ (u[:, None] * jac) + np.diag(prior)
        g = jac.T @ (u * (t - log_m)) + prior * (z - z0)
        step = np.linalg.solve(h + damping * np.diag(np.diag(h)), g)
        z_new = np.clip(z - step, z0 - 12.0, z0 + 12.0)
        t_new, jac_new = pair.log_t(z_new)
        new = loss(z_new, t_new)
        if new < cur:
            z, t, jac, cur, damping = z_new, t_new, jac_new, new, damping / 3
            if np.max(np.abs(step)) < 1e-5:
                break
        else:
            damping *= 5
            if damping > 1e8:
                break
    return z


def _covariance(pair: Pair) -> ConstantsCovariance | None:
    """The fitted entries' covariance (SI units) and the residual variance of the log times."""
    n, p = len(pair.measured), len(pair.entries)
    if n <= p:
        return None
    t, jac = pair.log_t(pair.z)
    r = t - np.log(pair.measured)
    var = float(np.sum(r**2) / (n - p))
    cov_z = var * np.linalg.pinv(jac.T @ jac + np.diag(_prior(pair, n)))
    d = _dx_dz(pair.entries, np.array(list(pair.values().values())))
    return ConstantsCovariance(pair.entries, d[:, None] * cov_z * d[None, :], var, n - p)


def _fits(pairs: dict, zs: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Every stack's fitted entries (``stack -> hardware -> entry -> value``) of the fits
    ``zs`` (``(stack, hw) -> z``, None where the pair had too few rows)."""
    out: dict[str, dict] = {}
    for (st, hw), z in zs.items():
        if z is not None:
            out.setdefault(st, {})[hw] = pairs[(st, hw)].values(z)
    return out


def _carried_prediction(runs, pair: Pair, fits: dict) -> tuple[np.ndarray, str]:
    """A pair's rows predicted with the constants ``stack_constants`` gives them when the pair
    has no fit of its own, from the other fits ``fits`` (carried over, or the preset's)."""
    preset = dataclasses.replace(load_stack(pair.stack), constants={})
    sc = stack_constants(preset, runs[pair.idx[0]].hardware, fits=fits)
    z = _to_z(pair.entries, np.asarray(entry_values(sc.constants, pair.entries)))
    return pair.predicted(z, sc.constants), sc.status


@dataclasses.dataclass
class StackFits:
    """Every pair's fit and each run's errors (percent, predicted / measured − 1)."""

    runs: list[PublishedRun]
    pairs: dict[tuple[str, str], Pair]
    table: pd.DataFrame  # one row per run
    between_var: float  # pooled between-source variance of log step time
    carried_var: dict[str, float]  # stack -> carried-over variance


def fit_stacks(runs: list[PublishedRun], *, leave_one_row_out: bool = True) -> StackFits:
    """Fits every pair, then the three held-out predictions of every run (module docstring);
    ``leave_one_row_out=False`` skips the one fit per row (its column is NaN)."""
    pairs = _pairs(runs)
    pos = {k: {i: j for j, i in enumerate(p.idx)} for k, p in pairs.items()}
    n = len(runs)
    cols = {k: np.full(n, np.nan) for k in ("uncal", "fit", "loro", "loso")}
    loso_kind = np.array([""] * n, dtype=object)
    pair_of = np.array([""] * n, dtype=object)
    for p in pairs.values():
        p.z = _solve(p, np.ones(len(p.idx)))
        p.covariance = _covariance(p)
    for i, r in enumerate(runs):
        units = _units(r, pairs)
        if not units:
            continue
        p = pairs[units[0]]
        j = pos[units[0]][i]
        pair_of[i] = f"{p.stack} {p.hardware}"
        cols["fit"][i] = p.predicted()[j]
        cols["uncal"][i] = p.predicted(p.z0)[j]
        if leave_one_row_out:
            w = np.ones(len(p.idx))
            w[j] = 0.0
            z = _solve(p, w)
            cols["loro"][i] = p.predicted(z if z is not None else p.z0)[j]
    for source in sorted({r.source_id for r in runs}):
        held = np.array([r.source_id == source for r in runs])
        fits = {key: _solve(p, (~held[p.idx]).astype(float)) for key, p in pairs.items()}
        for i in np.flatnonzero(held):
            r = runs[i]
            units = [k for k in _units(r, pairs) if fits[k] is not None]
            if units:
                p = pairs[units[0]]
                cols["loso"][i] = p.predicted(fits[units[0]])[pos[units[0]][i]]
                loso_kind[i] = "fitted" if units[0][0] == r.stack else "fitted (stack)"
                continue
            key = (stack_name(r), r.hardware.name)
            if key not in pairs:
                continue
            others = {k: v for k, v in fits.items() if k[1] != r.hardware.name or k[0] != key[0]}
            t, kind = _carried_prediction(runs, pairs[key], _fits(pairs, others))
            cols["loso"][i] = t[pos[key][i]]
            loso_kind[i] = kind
    table = _table(runs, cols, loso_kind, pair_of)
    fitted_rows = table[table.loso_from.str.startswith("fitted")]
    between = (
        float(np.mean(np.log1p(fitted_rows.loso_err_pct / 100) ** 2)) if len(fitted_rows) else 0.0
    )
    carried = _carried_variances(runs, pairs)
    return StackFits(runs, pairs, table, between, carried)


def _carried_variances(runs, pairs) -> dict[str, float]:
    """Per stack: the mean squared log error of each of its pooled pairs predicted as if it had
    no runs (:func:`_carried_prediction` from the stack's fits on other hardware)."""
    errs: dict[str, list[float]] = {}
    for key, p in pairs.items():
        if "@" in key[0]:
            continue
        others = {k: q.z for k, q in pairs.items() if k[1] != key[1]}
        t, _ = _carried_prediction(runs, p, _fits(pairs, others))
        errs.setdefault(p.stack, []).extend(np.log(t / p.measured).tolist())
    return {st: float(np.mean(np.square(e))) for st, e in errs.items()}


def _table(runs, cols, loso_kind, pair_of) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(runs):
        m = r.measured_step_s
        rows.append(
            {
                "label": r.label,
                "source": r.source_id,
                "stack": stack_name(r),
                "hardware": r.hardware.name,
                "group": r.group,
                "measured_s": m,
                "uncal_err_pct": 100 * (cols["uncal"][i] / m - 1),
                "fit_err_pct": 100 * (cols["fit"][i] / m - 1),
                "loro_err_pct": 100 * (cols["loro"][i] / m - 1),
                "loso_err_pct": 100 * (cols["loso"][i] / m - 1),
                "loso_from": loso_kind[i],
                "pair": pair_of[i],
            }
        )
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, by=("stack", "hardware")) -> pd.DataFrame:
    """Mean absolute error of each way, per group."""

    def mae(col):
        return lambda d: float(np.nanmean(np.abs(d[col]))) if d[col].notna().any() else math.nan

    g = table.groupby(list(by), sort=True)
    out = pd.DataFrame(
        {
            "runs": g.size(),
            "sources": g["source"].nunique(),
            "uncalibrated_pct": g.apply(mae("uncal_err_pct")),
            "fitted_pct": g.apply(mae("fit_err_pct")),
            "leave_one_row_out_pct": g.apply(mae("loro_err_pct")),
            "leave_one_source_out_pct": g.apply(mae("loso_err_pct")),
        }
    )
    return out.reset_index()


def coverage(sf: StackFits, level: float = DEFAULT_LEVEL) -> pd.DataFrame:
    """Per source: the share of its rows whose measurement lies inside the ``level`` interval of
    its leave-one-source-out prediction. The interval's width is what the stack file carries,
    estimated without the source's own rows: the between-source scatter of the row's pair (or
    the pooled one, :func:`_between`) where a fit predicted it, the stack's carried-over scatter
    otherwise."""
    t = sf.table
    fitted = t.loso_from.str.startswith("fitted")
    out = []
    for source, d in t.groupby("source"):
        rest = t[(t.source != source) & fitted]
        pooled = float(np.mean(np.log1p(rest.loso_err_pct / 100) ** 2)) if len(rest) else 0.0
        inside = 0
        for _, row in d.iterrows():
            if row.loso_from.startswith("fitted"):
                mine = rest[rest.pair == row.pair]
                var = (
                    float(np.mean(np.log1p(mine.loso_err_pct / 100) ** 2))
                    if len(mine) >= MIN_ROWS
                    else pooled
                )
            else:
                var = sf.carried_var.get(row.stack, pooled)
            q = t_quantile(level, max(len(rest) - 1, 1))
            inside += abs(math.log1p(row.loso_err_pct / 100)) <= q * math.sqrt(var)
        out.append({"source": source, "runs": len(d), "inside_pct": 100 * inside / len(d)})
    return pd.DataFrame(out)


def constants_blocks(sf: StackFits) -> dict[str, dict]:
    """Per stack name (``NAME`` or ``NAME@VERSION``): its ``constants`` block (module docstring
    of :mod:`perfmodel.plan.stack_constants`)."""
    blocks: dict[str, dict] = {}
    t = sf.table
    for (st, hw), p in sf.pairs.items():
        d = t.iloc[p.idx]
        mine = t.pair == f"{st} {hw}"  # the rows this pair predicts (no more specific one)
        entry = {
            "status": "fitted",
            "values": p.values(),
            "runs": len(p.idx),
            "sources": sorted(d.source.unique().tolist()),
            "error_pct": {
                k: _mae(t[mine][c])
                for k, c in (
                    ("uncalibrated", "uncal_err_pct"),
                    ("fitted", "fit_err_pct"),
                    ("leave_one_row_out", "loro_err_pct"),
                    ("leave_one_source_out", "loso_err_pct"),
                )
            },
        }
        if p.covariance is not None:
            doc = p.covariance.to_dict()
            doc["residual_variance_log"] = max(doc["residual_variance_log"], _between(sf, st, hw))
            entry["covariance"] = doc
        blocks.setdefault(st, {})[hw] = entry
    for st, var in sf.carried_var.items():
        blocks.setdefault(st, {})[CARRIED] = {
            "residual_variance_log": var,
            "measured_by": "each fitted hardware of the stack predicted as if it had no runs",
        }
    return blocks


def _between(sf: StackFits, stack: str, hw: str) -> float:
    """The between-source variance of a pair's log step times: the mean squared log error of
    its rows predicted by a fit without their source, where at least :data:`MIN_ROWS` were;
    else the pooled one of every such row."""
    t = sf.table
    rows = sf.table.iloc[sf.pairs[(stack, hw)].idx]
    rows = rows[rows.loso_from.str.startswith("fitted")]
    if len(rows) < MIN_ROWS:
        return sf.between_var
    del t
    return float(np.mean(np.log1p(rows.loso_err_pct / 100) ** 2))


def _mae(s: pd.Series) -> float | None:
    s = s.dropna()
    return round(float(np.mean(np.abs(s))), 2) if len(s) else None


def write_blocks(blocks: dict[str, dict], stacks_dir: Path) -> None:
    """Rewrites the ``constants`` block of each stack file, a version's in its variant
    (atomically)."""
    files: dict[str, dict] = {}
    for st, block in blocks.items():
        base, _, version = st.partition("@")
        if base not in files:
            files[base] = json.loads((stacks_dir / f"{base}.json").read_text())
        doc = files[base]
        if version:
            doc["variants"][version]["constants"] = _rounded(block)
        else:
            doc["constants"] = _rounded(block)
    for base, doc in files.items():
        atomic_write_text(
            stacks_dir / f"{base}.json", json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        )


def _rounded(x):
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stack files' constants")
    ap.add_argument("--table", metavar="CSV", help="also write the per-run predictions to CSV")
    ap.add_argument("--no-loro", action="store_true", help="skip the leave-one-row-out fits")
    args = ap.parse_args(argv)
    runs, _ = load_published_runs(MAIN_CSV)
    sf = fit_stacks(runs, leave_one_row_out=not args.no_loro)
    if args.table:
        sf.table.to_csv(args.table, index=False)
    pd.set_option("display.width", 200)
    print(summary(sf.table).round(1).to_string(index=False))
    print(coverage(sf).round(1).to_string(index=False))
    if args.write:
        from perfmodel.specs.stack_preset import _stacks_dir

        write_blocks(constants_blocks(sf), _stacks_dir())


if __name__ == "__main__":
    main()
