"""Bilateral bounded-price contracts: their terms and their life cycle, as pure rules.

The registry stores contracts and carries these rules out; nothing here does I/O.
"""

from bpm.contracts.rules import (
    ContractState,
    ContractTerms,
    TermsError,
    TransitionError,
    next_state,
    validate_terms,
)

__all__ = [
    "ContractState",
    "ContractTerms",
    "TermsError",
    "TransitionError",
    "next_state",
    "validate_terms",
]
