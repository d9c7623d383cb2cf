"""Convex, increasing cost functions of load, D(0) = 0, and fitting them to measurements.

Pure Python and NumPy at import time (SciPy is imported by the fit only), so the live
agent and the simulator can use it without Spark.
"""

from bpm.costs.analytic import MM1Cost, QuadraticCost
from bpm.costs.base import CostFitError, CostFunction, FallbackCost, cost_function_from_dict
from bpm.costs.fit import fit_cost_function
from bpm.costs.piecewise import FitInfo, PiecewiseLinearCost

__all__ = [
    "CostFitError",
    "CostFunction",
    "FallbackCost",
    "FitInfo",
    "MM1Cost",
    "PiecewiseLinearCost",
    "QuadraticCost",
    "cost_function_from_dict",
    "fit_cost_function",
]
