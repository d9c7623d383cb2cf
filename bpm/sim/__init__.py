"""A discrete-round federation simulator that decides with `bpm.negotiation` unchanged."""

from bpm.sim.bound import divisible_optimum
from bpm.sim.federation import Event, Federation, Participant
from bpm.sim.generate import SimConfig, build_federation, contract_graph
from bpm.sim.runner import RunResult, run_many, simulate_once, summarize

__all__ = [
    "Event",
    "Federation",
    "Participant",
    "RunResult",
    "SimConfig",
    "build_federation",
    "contract_graph",
    "divisible_optimum",
    "run_many",
    "simulate_once",
    "summarize",
]
