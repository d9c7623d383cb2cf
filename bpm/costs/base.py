"""The cost-function interface shared by every cost model, and its JSON round trip.

A participant's cost D(L) is private, convex and increasing in its load L, with
D(0) = 0. Loads are fractions of the participant's capacity (0..1, more in overload).
Prices are per unit of load per second, in the same unit as D.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

_REGISTRY: dict[str, type[CostFunction]] = {}


class CostFitError(ValueError):
    """Samples from which no convex increasing cost curve can honestly be fitted."""


class CostFunction(ABC):
    """A convex, increasing cost of load with D(0) = 0.

    Subclasses implement `cost`, `marginal` (right derivative), `threshold` and the
    dict round trip; the per-unit marginal costs of shedding or taking a set of tasks
    follow from `cost` and are the same for every model.
    """

    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind:
            _REGISTRY[kind] = cls

    @abstractmethod
    def cost(self, load: float) -> float:
        """D(load); `load` must be >= 0."""

    @abstractmethod
    def marginal(self, load: float) -> float:
        """dD/dL at `load` (the right derivative where D has a kink)."""

    @abstractmethod
    def threshold(self, price: float) -> float:
        """The smallest load at which the marginal cost reaches `price` (0 when it already
        does at no load, `math.inf` when it never does)."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description; `cost_function_from_dict` reverses it."""

    @classmethod
    @abstractmethod
    def _from_dict(cls, d: dict[str, Any]) -> CostFunction: ...

    @property
    def fallback_used(self) -> bool:
        """True when this function stands in for a fit that failed (see `FallbackCost`)."""
        return False

    def marginal_shed(self, load: float, amount: float) -> float:
        """Per-unit cost saved by shedding `amount` of `load`: (D(L) - D(L - a)) / a."""
        if not amount > 0:
            raise ValueError(f"amount to shed must be positive, got {amount!r}")
        rest = load - amount
        if rest < 0:
            if rest < -1e-9 * max(1.0, load):
                raise ValueError(f"cannot shed {amount!r} from a load of {load!r}")
            rest = 0.0
        return (self.cost(load) - self.cost(rest)) / amount

    def marginal_take(self, load: float, amount: float) -> float:
        """Per-unit cost added by taking `amount` on top of `load`: (D(L + a) - D(L)) / a."""
        if not amount > 0:
            raise ValueError(f"amount to take must be positive, got {amount!r}")
        return (self.cost(load + amount) - self.cost(load)) / amount


class FallbackCost(CostFunction):
    """A stand-in returned by `fit_cost_function` when the samples could not be fitted.

    It behaves exactly like the wrapped function; `fallback_used` is True and `reason`
    says why the fit was refused, so an agent can report "fallback in use".
    """

    kind = "fallback"

    def __init__(self, function: CostFunction, reason: str) -> None:
        self.function = function
        self.reason = reason

    def __repr__(self) -> str:
        return f"FallbackCost({self.function!r}, reason={self.reason!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FallbackCost) and (self.function, self.reason) == (other.function, other.reason)

    def __hash__(self) -> int:
        return hash((self.function, self.reason))

    @property
    def fallback_used(self) -> bool:
        return True

    def cost(self, load: float) -> float:
        return self.function.cost(load)

    def marginal(self, load: float) -> float:
        return self.function.marginal(load)

    def threshold(self, price: float) -> float:
        return self.function.threshold(price)

    def marginal_shed(self, load: float, amount: float) -> float:
        return self.function.marginal_shed(load, amount)

    def marginal_take(self, load: float, amount: float) -> float:
        return self.function.marginal_take(load, amount)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "function": self.function.to_dict()}

    @classmethod
    def _from_dict(cls, d: dict[str, Any]) -> FallbackCost:
        return cls(cost_function_from_dict(d["function"]), str(d.get("reason", "")))


def cost_function_from_dict(d: dict[str, Any]) -> CostFunction:
    """Rebuild a cost function from `CostFunction.to_dict()` output."""
    try:
        cls = _REGISTRY[d["kind"]]
    except KeyError:
        raise ValueError(f"unknown cost function kind in {d!r}; known: {sorted(_REGISTRY)}") from None
    return cls._from_dict(d)


def check_load(load: float) -> float:
    """Reject loads a cost function cannot carry (negative, NaN, infinite)."""
    if not (load >= 0 and math.isfinite(load)):
        raise ValueError(f"load must be a finite number >= 0, got {load!r}")
    return load


def check_price(price: float) -> float:
    if not (price >= 0 and math.isfinite(price)):
        raise ValueError(f"price must be a finite number >= 0, got {price!r}")
    return price
