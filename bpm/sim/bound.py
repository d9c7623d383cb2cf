"""The lower bound a run's total cost is compared with.

The same total load spread as if it were divisible, over all participants, ignoring
contracts: minimise sum_i D_i(x_i) subject to sum_i x_i = total, x_i >= 0. For convex
D_i the optimum equalises marginal costs: x_i = threshold_i(lam) for the one price
lam at which those loads add up to the total, found with SciPy's `brentq`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bpm.costs.base import CostFunction


def divisible_optimum(costs: Sequence[CostFunction], total: float) -> tuple[float, np.ndarray]:
    """The least total cost of carrying `total` (and the loads that reach it)."""
    from scipy.optimize import brentq

    if total <= 0:
        return 0.0, np.zeros(len(costs))

    def spread(lam: float) -> np.ndarray:
        return np.fromiter((min(c.threshold(lam), total) for c in costs), dtype=float, count=len(costs))

    hi = max(c.marginal(total / len(costs)) for c in costs)
    while spread(hi).sum() < total:
        hi *= 2.0
        if not math.isfinite(hi):
            raise ArithmeticError("no price spreads the load: are the cost functions increasing?")
    lam = brentq(lambda p: spread(p).sum() - total, 0.0, hi, xtol=1e-12 * hi, rtol=1e-12)
    x = spread(lam)
    # Kinks (piecewise-linear curves) can leave a sliver; give it to the cheapest taker at lam.
    gap = total - x.sum()
    if abs(gap) > 1e-12 * total:
        k = int(np.argmin([c.marginal(xi) for c, xi in zip(costs, x)])) if gap > 0 else int(np.argmax(x))
        x[k] = max(x[k] + gap, 0.0)
    return math.fsum(c.cost(float(xi)) for c, xi in zip(costs, x)), x
