"""The Bounded-Price Mechanism's decisions: pure functions, no I/O, no clock, no Spark.

The simulator (`bpm.sim`) and the live agents call exactly these.
"""

from bpm.negotiation.decisions import (
    after_answer,
    choose_offer,
    contract_order,
    evaluate_offer,
    is_acceptable,
    movements_to_end,
    not_offerable,
    settle,
    settle_price,
    why_no_offer,
    why_refused,
)
from bpm.negotiation.granularity import REFUSED_SPLITS, choose_merge, choose_split, piece_load, reference_price, split_depth
from bpm.negotiation.models import (
    DEFAULT_HYSTERESIS,
    DEFAULT_MARGIN,
    Acceptance,
    Contract,
    Movement,
    MovementState,
    Offer,
    OfferState,
    Task,
)

__all__ = [
    "DEFAULT_HYSTERESIS",
    "DEFAULT_MARGIN",
    "Acceptance",
    "Contract",
    "Movement",
    "MovementState",
    "Offer",
    "OfferState",
    "Task",
    "after_answer",
    "REFUSED_SPLITS",
    "choose_merge",
    "choose_offer",
    "choose_split",
    "contract_order",
    "evaluate_offer",
    "is_acceptable",
    "movements_to_end",
    "not_offerable",
    "piece_load",
    "reference_price",
    "settle",
    "settle_price",
    "split_depth",
    "why_no_offer",
    "why_refused",
]
