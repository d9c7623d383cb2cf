"""A convex increasing piecewise-linear cost, the shape `fit_cost_function` produces."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from bpm.costs.base import CostFunction, check_load, check_price


@dataclass(frozen=True, slots=True)
class FitInfo:
    """How a fitted curve came about (kept for reports, not used by decisions).

    Attributes:
        samples: number of samples used.
        rmse: root-mean-square residual of the fit, in the unit of the samples' values.
        intercept: fitted value at load 0, removed so that D(0) = 0 (the idle cost).
        load_min, load_max: the range of loads the samples covered; beyond it the
            curve is an extrapolation with the last slope.
    """

    samples: int
    rmse: float
    intercept: float
    load_min: float
    load_max: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "rmse": self.rmse,
            "intercept": self.intercept,
            "load_min": self.load_min,
            "load_max": self.load_max,
        }


@dataclass(frozen=True, slots=True)
class PiecewiseLinearCost(CostFunction):
    """D(0) = 0, slope `slopes[k]` on `[knots[k], knots[k+1])`, the last slope beyond the last knot.

    Attributes:
        knots: increasing loads, the first one 0.
        slopes: one per knot, non-negative and non-decreasing (so D is convex and
            increasing), the last one positive.
        fit: diagnostics when the curve was fitted from samples, else None.
    """

    kind = "piecewise_linear"
    knots: tuple[float, ...]
    slopes: tuple[float, ...]
    fit: FitInfo | None = field(default=None, compare=False)
    _values: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        knots = tuple(float(k) for k in self.knots)
        slopes = tuple(float(s) for s in self.slopes)
        if not knots or len(knots) != len(slopes):
            raise ValueError("PiecewiseLinearCost needs as many slopes as knots, at least one")
        if knots[0] != 0.0:
            raise ValueError(f"the first knot must be 0, got {knots[0]!r}")
        if any(not math.isfinite(k) for k in knots) or any(b <= a for a, b in zip(knots, knots[1:])):
            raise ValueError(f"knots must be finite and strictly increasing, got {knots!r}")
        if any(not (math.isfinite(s) and s >= 0) for s in slopes):
            raise ValueError(f"slopes must be finite and >= 0, got {slopes!r}")
        if any(b < a for a, b in zip(slopes, slopes[1:])):
            raise ValueError(f"slopes must be non-decreasing (convex curve), got {slopes!r}")
        if not slopes[-1] > 0:
            raise ValueError("the last slope must be positive (increasing curve)")
        values = [0.0]
        for k in range(1, len(knots)):
            values.append(values[-1] + slopes[k - 1] * (knots[k] - knots[k - 1]))
        object.__setattr__(self, "knots", knots)
        object.__setattr__(self, "slopes", slopes)
        object.__setattr__(self, "_values", tuple(values))

    def _segment(self, load: float) -> int:
        # Index of the segment whose half-open interval [knot_k, knot_k+1) holds `load`.
        return bisect.bisect_right(self.knots, load) - 1

    def cost(self, load: float) -> float:
        u = check_load(load)
        k = self._segment(u)
        return self._values[k] + self.slopes[k] * (u - self.knots[k])

    def marginal(self, load: float) -> float:
        return self.slopes[self._segment(check_load(load))]

    def threshold(self, price: float) -> float:
        p = check_price(price)
        k = bisect.bisect_left(self.slopes, p)
        return self.knots[k] if k < len(self.knots) else math.inf

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "knots": list(self.knots), "slopes": list(self.slopes)}
        if self.fit is not None:
            d["fit"] = self.fit.to_dict()
        return d

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> PiecewiseLinearCost:
        fit = FitInfo(**d["fit"]) if d.get("fit") else None
        return cls(knots=tuple(d["knots"]), slopes=tuple(d["slopes"]), fit=fit)
