"""The analytic and piecewise-linear cost models keep their promises: D(0) = 0, convex,
increasing, marginal costs consistent with D, thresholds the inverse of the marginal."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpm.costs import (
    CostFunction,
    FallbackCost,
    MM1Cost,
    PiecewiseLinearCost,
    QuadraticCost,
    cost_function_from_dict,
)

positive = st.floats(min_value=0.05, max_value=20.0, allow_nan=False)


@st.composite
def cost_functions(draw) -> CostFunction:
    kind = draw(st.sampled_from(["mm1", "quadratic", "piecewise"]))
    if kind == "mm1":
        return MM1Cost(a=draw(positive), c=draw(st.floats(0.5, 2.0)), cutoff=draw(st.floats(0.5, 0.99)))
    if kind == "quadratic":
        return QuadraticCost(a=draw(positive), b=draw(st.floats(0.0, 5.0)))
    n = draw(st.integers(1, 6))
    gaps = draw(st.lists(st.floats(0.01, 0.5), min_size=n - 1, max_size=n - 1))
    knots = [0.0]
    for g in gaps:
        knots.append(knots[-1] + g)
    steps = draw(st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n))
    slopes = []
    acc = 0.0
    for s in steps:
        acc += s
        slopes.append(acc)
    if slopes[-1] <= 0:
        slopes[-1] = 1.0
    return PiecewiseLinearCost(knots=tuple(knots), slopes=tuple(slopes))


loads = st.floats(min_value=0.0, max_value=3.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(cost_functions(), loads, loads, st.floats(0.0, 1.0))
def test_zero_at_zero_increasing_and_convex(d: CostFunction, x: float, y: float, w: float) -> None:
    lo, hi = min(x, y), max(x, y)
    assert d.cost(0.0) == 0.0
    assert d.cost(hi) >= d.cost(lo) - 1e-12 * (1 + abs(d.cost(hi)))
    mid = w * lo + (1 - w) * hi
    chord = w * d.cost(lo) + (1 - w) * d.cost(hi)
    assert d.cost(mid) <= chord + 1e-9 * (1 + abs(chord))
    assert d.marginal(hi) >= d.marginal(lo) - 1e-12 * (1 + d.marginal(hi))


@settings(max_examples=300, deadline=None)
@given(cost_functions(), st.floats(0.01, 3.0), st.floats(0.001, 1.0))
def test_marginal_shed_and_take_lie_between_the_marginals(d: CostFunction, load: float, frac: float) -> None:
    amount = load * frac
    shed = d.marginal_shed(load, amount)
    take = d.marginal_take(load, amount)
    tol = 1e-7 * (1 + d.marginal(load + amount))
    # Convexity: the unit cost of shedding sits between the marginals at both ends, and
    # taking the same amount never costs less per unit than shedding it saves.
    assert d.marginal(load - amount) - tol <= shed <= d.marginal(load) + tol
    assert d.marginal(load) - tol <= take <= d.marginal(load + amount) + tol
    assert shed <= take + tol
    assert math.isclose(shed * amount, d.cost(load) - d.cost(load - amount), rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(cost_functions(), st.floats(0.0, 2.5))
def test_marginal_is_the_right_derivative(d: CostFunction, load: float) -> None:
    h = 1e-6
    numeric = (d.cost(load + h) - d.cost(load)) / h
    assert numeric == pytest.approx(d.marginal(load), rel=1e-3, abs=1e-4)


@settings(max_examples=300, deadline=None)
@given(cost_functions(), st.floats(0.0, 50.0))
def test_threshold_is_where_the_marginal_reaches_the_price(d: CostFunction, price: float) -> None:
    t = d.threshold(price)
    if math.isinf(t):
        assert d.marginal(1e6) < price
        return
    assert t >= 0
    assert d.marginal(t) >= price - 1e-9 * (1 + price)
    if t > 1e-9:
        assert d.marginal(t * (1 - 1e-6) - 1e-12) <= price + 1e-6 * (1 + price)


@pytest.mark.parametrize(
    "d",
    [MM1Cost(), MM1Cost(a=2.0, c=1.5, cutoff=0.9), QuadraticCost(3.0, 0.5),
     PiecewiseLinearCost(knots=(0.0, 0.5), slopes=(1.0, 3.0)), FallbackCost(MM1Cost(), "too few samples")],
)
def test_dict_round_trip(d: CostFunction) -> None:
    back = cost_function_from_dict(d.to_dict())
    assert back == d
    assert back.fallback_used == d.fallback_used


def test_mm1_matches_the_borealis_form_and_stays_finite_past_capacity() -> None:
    d = MM1Cost(a=1.0, c=1.0)
    assert d.cost(0.5) == pytest.approx(1.0)
    assert d.marginal(0.5) == pytest.approx(4.0)
    u0 = 0.95
    # Value and slope continue smoothly into the quadratic extension past the cut-off.
    assert d.cost(u0 + 1e-9) == pytest.approx(d.cost(u0), rel=1e-6)
    assert d.marginal(u0 + 1e-9) == pytest.approx(d.marginal(u0), rel=1e-6)
    assert math.isfinite(d.cost(5.0)) and math.isfinite(d.marginal(5.0))
    assert d.threshold(d.marginal(2.0)) == pytest.approx(2.0)
    assert MM1Cost.with_threshold(0.7, 2.0).marginal(0.7) == pytest.approx(2.0)
    assert QuadraticCost.with_threshold(0.7, 2.0).threshold(2.0) == pytest.approx(0.7)


def test_bad_parameters_and_loads_are_refused() -> None:
    for make in (lambda: MM1Cost(a=0), lambda: MM1Cost(cutoff=1.0), lambda: QuadraticCost(a=-1),
                 lambda: PiecewiseLinearCost(knots=(0.0, 1.0), slopes=(2.0, 1.0)),
                 lambda: PiecewiseLinearCost(knots=(0.1,), slopes=(1.0,))):
        with pytest.raises(ValueError):
            make()
    with pytest.raises(ValueError):
        MM1Cost().cost(-0.1)
    with pytest.raises(ValueError):
        MM1Cost().cost(math.nan)
    with pytest.raises(ValueError):
        MM1Cost().marginal_shed(0.2, 0.5)
    with pytest.raises(ValueError):
        MM1Cost().marginal_take(0.2, 0.0)
    with pytest.raises(ValueError):
        cost_function_from_dict({"kind": "nope"})
