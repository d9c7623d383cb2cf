"""Fitting cost curves to measured samples: convex and increasing whatever the noise,
clear errors or the documented fallback on bad samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpm.costs import CostFitError, FallbackCost, MM1Cost, PiecewiseLinearCost, cost_function_from_dict, fit_cost_function


def _assert_convex_increasing(d: PiecewiseLinearCost) -> None:
    assert d.cost(0.0) == 0.0
    assert all(s >= 0 for s in d.slopes)
    assert all(b >= a for a, b in zip(d.slopes, d.slopes[1:]))
    assert d.slopes[-1] > 0


def test_fit_recovers_a_noisy_mm1_curve() -> None:
    rng = np.random.default_rng(1)
    truth = MM1Cost(a=0.2)
    x = rng.uniform(0.0, 0.85, 400)
    overhead = 0.5  # a batch's fixed cost at no load: removed by the fit
    y = overhead + np.array([truth.cost(v) for v in x]) + rng.normal(0, 0.02, x.size)
    d = fit_cost_function(x, y)
    assert isinstance(d, PiecewiseLinearCost) and not d.fallback_used
    _assert_convex_increasing(d)
    assert d.fit is not None and d.fit.intercept == pytest.approx(overhead, abs=0.05)
    for u in (0.2, 0.5, 0.8):
        assert d.cost(u) == pytest.approx(truth.cost(u), abs=0.08)
    assert cost_function_from_dict(d.to_dict()) == d


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.5, allow_nan=False), st.floats(0.0, 100.0, allow_nan=False)),
        min_size=5,
        max_size=60,
    )
)
def test_any_valid_samples_give_a_convex_increasing_curve_or_a_clear_error(samples) -> None:
    x = [s[0] for s in samples]
    y = [s[1] for s in samples]
    try:
        d = fit_cost_function(x, y)
    except CostFitError as err:
        assert str(err)
        return
    _assert_convex_increasing(d)
    for u in np.linspace(0, 2, 9):
        assert math.isfinite(d.cost(float(u)))


@pytest.mark.parametrize(
    ("loads", "values", "message"),
    [
        ([0.1, 0.2, math.nan, 0.4, 0.5], [1, 2, 3, 4, 5], "NaN or infinite"),
        ([0.1, 0.2, 0.3, 0.4, 0.5], [1, 2, math.inf, 4, 5], "NaN or infinite"),
        ([0.1, -0.2, 0.3, 0.4, 0.5], [1, 2, 3, 4, 5], "negative"),
        ([0.1, 0.2, 0.3], [1, 2, 3], "at least 5"),
        ([0.5] * 10, list(range(10)), "one load"),
        ([0.1, 0.2, 0.3, 0.4, 0.5], [5, 4, 3, 2, 1], "do not increase"),
        ([0.1, 0.2, 0.3, 0.4, 0.5], [2, 2, 2, 2, 2], "do not increase"),
        ([0.1, 0.2], [1, 2, 3], "pairs"),
    ],
)
def test_bad_samples_raise_or_fall_back(loads, values, message) -> None:
    with pytest.raises(CostFitError, match=message):
        fit_cost_function(loads, values)
    fallback = MM1Cost()
    d = fit_cost_function(loads, values, fallback=fallback)
    assert isinstance(d, FallbackCost)
    assert d.fallback_used and message.split()[0] in d.reason
    assert d.cost(0.5) == fallback.cost(0.5) and d.threshold(2.0) == fallback.threshold(2.0)
