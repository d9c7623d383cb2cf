"""Fitting a convex increasing cost curve to what an agent measures on Spark.

The samples are (load, value) pairs: utilisation against batch duration, latency or
backlog. The fit is a least-squares piecewise-linear curve written as

    value(x) = b + s0 * x + sum_k d_k * max(0, x - t_k),    s0 >= 0, d_k >= 0

with knots t_k at quantiles of the sampled loads. Non-negative s0 and d_k make every
slope non-negative and the slopes non-decreasing, so the result is convex and
increasing *by construction*, however noisy the samples are; SciPy's bounded linear
least squares (`scipy.optimize.lsq_linear`) solves it. The intercept b (the value at no
load, e.g. a batch's fixed overhead) is then dropped: D(x) = value(x) - b, so D(0) = 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bpm.costs.base import CostFitError, CostFunction, FallbackCost
from bpm.costs.piecewise import FitInfo, PiecewiseLinearCost

MIN_SAMPLES = 5
MIN_DISTINCT_LOADS = 3
DEFAULT_MAX_SEGMENTS = 6


def fit_cost_function(
    loads: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    *,
    fallback: CostFunction | None = None,
    max_segments: int = DEFAULT_MAX_SEGMENTS,
) -> CostFunction:
    """Fit a convex increasing `PiecewiseLinearCost` with D(0) = 0 to measured samples.

    Bad samples raise `CostFitError` with the reason: any NaN or infinite value, a
    negative load or value, fewer than 5 samples, fewer than 3 distinct loads (for
    example all at one load), or values that do not increase with load. With a
    `fallback`, the same cases return `FallbackCost(fallback, reason)` instead, whose
    `fallback_used` is True, so the caller can say that the fallback is in use.
    """
    try:
        return _fit(loads, values, max_segments)
    except CostFitError as err:
        if fallback is None:
            raise
        return FallbackCost(fallback, str(err))


def _fit(loads: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray, max_segments: int) -> PiecewiseLinearCost:
    from scipy.optimize import lsq_linear

    if max_segments < 1:
        raise ValueError(f"max_segments must be >= 1, got {max_segments!r}")
    x = np.asarray(loads, dtype=float).ravel()
    y = np.asarray(values, dtype=float).ravel()
    if x.shape != y.shape:
        raise CostFitError(f"{x.size} loads but {y.size} values: samples must come in pairs")
    bad = ~(np.isfinite(x) & np.isfinite(y))
    if bad.any():
        raise CostFitError(f"{int(bad.sum())} of {x.size} samples are NaN or infinite")
    if (x < 0).any() or (y < 0).any():
        raise CostFitError(f"{int(((x < 0) | (y < 0)).sum())} of {x.size} samples have a negative load or value")
    if x.size < MIN_SAMPLES:
        raise CostFitError(f"{x.size} samples, at least {MIN_SAMPLES} are needed")
    distinct = np.unique(x)
    if distinct.size < MIN_DISTINCT_LOADS:
        where = "one load" if distinct.size == 1 else f"{distinct.size} loads"
        raise CostFitError(f"all samples are at {where}; at least {MIN_DISTINCT_LOADS} distinct loads are needed")

    segments = min(max_segments, distinct.size - 1)
    # Interior knots at quantiles of the distinct loads, so every segment holds data.
    knots = np.quantile(distinct, np.linspace(0.0, 1.0, segments + 1))[1:-1]
    knots = np.unique(knots[knots > 0])
    design = np.column_stack([np.ones_like(x), x] + [np.maximum(0.0, x - t) for t in knots])
    scale = max(float(np.max(np.abs(y))), 1e-300)
    lower = np.r_[-np.inf, np.zeros(1 + knots.size)]
    sol = lsq_linear(design, y / scale, bounds=(lower, np.inf), method="bvls")
    params = sol.x * scale
    intercept, s0, steps = float(params[0]), float(params[1]), params[2:]

    slopes = np.maximum(s0 + np.r_[0.0, np.cumsum(steps)], 0.0)
    all_knots = np.r_[0.0, knots]
    # Merge segments whose slope did not change: same curve, fewer pieces.
    keep = np.r_[True, np.diff(slopes) > 1e-12 * max(1.0, float(slopes[-1]))]
    all_knots, slopes = all_knots[keep], slopes[keep]
    # The rise over the sampled range must be visible next to the values themselves.
    if not slopes[-1] * float(x.max()) > 1e-9 * scale:
        raise CostFitError("the values do not increase with load: no increasing cost curve fits them")
    rmse = float(np.sqrt(np.mean((design @ params - y) ** 2)))
    info = FitInfo(
        samples=int(x.size),
        rmse=rmse if math.isfinite(rmse) else math.inf,
        intercept=intercept,
        load_min=float(x.min()),
        load_max=float(x.max()),
    )
    return PiecewiseLinearCost(knots=tuple(all_knots.tolist()), slopes=tuple(slopes.tolist()), fit=info)
