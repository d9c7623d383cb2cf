"""Closed-form cost models: the Borealis M/M/1 delay curve and a quadratic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bpm.costs.base import CostFunction, check_load, check_price


@dataclass(frozen=True, slots=True)
class MM1Cost(CostFunction):
    """The M/M/1 delay form `D(u) = a*u / (c - u)` of the Borealis prototype.

    It diverges at u = c, but a simulator (and an agent in overload) must be able to
    price loads beyond capacity. So past `u0 = cutoff * c` the curve continues as its
    second-order Taylor expansion at u0: value, slope and curvature match at u0, the
    extension is a convex parabola, and cost, marginal and threshold stay finite for
    every load and price.

    Attributes:
        a: scale (cost of a unit of load at low utilisation is about a / c).
        c: capacity, in the same unit as the load (1.0: loads are fractions of capacity).
        cutoff: fraction of c where the quadratic extension takes over (0 < cutoff < 1).
    """

    kind = "mm1"
    a: float = 1.0
    c: float = 1.0
    cutoff: float = 0.95

    def __post_init__(self) -> None:
        if not (self.a > 0 and math.isfinite(self.a)):
            raise ValueError(f"MM1Cost.a must be > 0, got {self.a!r}")
        if not (self.c > 0 and math.isfinite(self.c)):
            raise ValueError(f"MM1Cost.c must be > 0, got {self.c!r}")
        if not 0 < self.cutoff < 1:
            raise ValueError(f"MM1Cost.cutoff must be in (0, 1), got {self.cutoff!r}")

    def cost(self, load: float) -> float:
        u = check_load(load)
        a, c = self.a, self.c
        u0 = self.cutoff * c
        if u <= u0:
            return a * u / (c - u)
        g = c - u0
        d = u - u0
        return a * u0 / g + (a * c / (g * g)) * d + (a * c / (g * g * g)) * d * d

    def marginal(self, load: float) -> float:
        u = check_load(load)
        a, c = self.a, self.c
        u0 = self.cutoff * c
        if u <= u0:
            return a * c / ((c - u) ** 2)
        g = c - u0
        return a * c / (g * g) + 2 * a * c / (g * g * g) * (u - u0)

    def threshold(self, price: float) -> float:
        p = check_price(price)
        a, c = self.a, self.c
        if p <= a / c:
            return 0.0
        u0 = self.cutoff * c
        g = c - u0
        m0 = a * c / (g * g)
        if p <= m0:
            return c - math.sqrt(a * c / p)
        return u0 + (p - m0) / (2 * a * c / (g * g * g))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "c": self.c, "cutoff": self.cutoff}

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> MM1Cost:
        return cls(a=float(d["a"]), c=float(d.get("c", 1.0)), cutoff=float(d.get("cutoff", 0.95)))

    @classmethod
    def with_threshold(cls, threshold: float, price: float, *, c: float = 1.0, cutoff: float = 0.95) -> MM1Cost:
        """The curve whose marginal cost equals `price` at load `threshold` (< cutoff * c)."""
        if not 0 < threshold < cutoff * c:
            raise ValueError(f"threshold must be in (0, {cutoff * c}), got {threshold!r}")
        return cls(a=price * (c - threshold) ** 2 / c, c=c, cutoff=cutoff)


@dataclass(frozen=True, slots=True)
class QuadraticCost(CostFunction):
    """`D(u) = a*u**2 + b*u`: the simplest strictly convex increasing cost.

    Attributes:
        a: curvature (> 0).
        b: linear part (>= 0), the marginal cost at no load.
    """

    kind = "quadratic"
    a: float = 1.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if not (self.a > 0 and math.isfinite(self.a)):
            raise ValueError(f"QuadraticCost.a must be > 0, got {self.a!r}")
        if not (self.b >= 0 and math.isfinite(self.b)):
            raise ValueError(f"QuadraticCost.b must be >= 0, got {self.b!r}")

    def cost(self, load: float) -> float:
        u = check_load(load)
        return (self.a * u + self.b) * u

    def marginal(self, load: float) -> float:
        return 2 * self.a * check_load(load) + self.b

    def threshold(self, price: float) -> float:
        return max(0.0, (check_price(price) - self.b) / (2 * self.a))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "a": self.a, "b": self.b}

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> QuadraticCost:
        return cls(a=float(d["a"]), b=float(d.get("b", 0.0)))

    @classmethod
    def with_threshold(cls, threshold: float, price: float) -> QuadraticCost:
        """The pure quadratic whose marginal cost equals `price` at load `threshold`."""
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        return cls(a=price / (2 * threshold))
