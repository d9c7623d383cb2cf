"""Contracts agreed offline become registry contracts: one side proposes, the other accepts matching terms."""

from __future__ import annotations

import pytest

from bpm.federation.views import AgreedTerms, contract_steps

TERMS = AgreedTerms("b", 1.0, 1.1, 15.0)


def contract(proposer, counterparty, state, awaiting=None, price_min=1.0, price_max=1.1, min_duration_s=15.0, id=1):
    return {"id": id, "proposer": proposer, "counterparty": counterparty, "state": state, "awaiting": awaiting,
            "price_min": price_min, "price_max": price_max, "min_duration_s": min_duration_s}


def test_parse_and_errors():
    assert AgreedTerms.parse("b:1.0:1.1:15") == TERMS
    for bad in ("b:1:2", ":1:2:3", "b:x:2:3"):
        with pytest.raises(ValueError):
            AgreedTerms.parse(bad)


def test_spec_is_what_parse_reads():
    for terms in (TERMS, AgreedTerms("c", 0.56, 0.8, 600.0, "passive_standby")):
        assert AgreedTerms.parse(terms.spec()) == terms
    assert TERMS.spec() == "b:1:1.1:15"


def test_the_first_name_proposes_once_the_partner_is_there():
    assert contract_steps("a", [TERMS], [], ["a"]) == [], "b has not joined yet"
    [step] = contract_steps("a", [TERMS], [], ["a", "b"])
    assert step.action == "propose" and step.terms == TERMS
    assert contract_steps("b", [AgreedTerms("a", 1.0, 1.1, 15.0)], [], ["a", "b"]) == [], "the other side waits"
    pending = contract("a", "b", "proposed", awaiting="b")
    assert contract_steps("a", [TERMS], [pending], ["a", "b"]) == [], "no second proposal"


def test_the_other_side_accepts_only_the_terms_it_agreed():
    mine = AgreedTerms("a", 1.0, 1.1, 15.0)
    [step] = contract_steps("b", [mine], [contract("a", "b", "proposed", awaiting="b", id=7)], ["a", "b"])
    assert (step.action, step.contract_id) == ("accept", 7)
    other = contract("a", "b", "proposed", awaiting="b", price_max=2.0)
    assert contract_steps("b", [mine], [other], ["a", "b"]) == [], "different terms are left for a person"


def test_nothing_to_do_with_an_active_contract():
    assert contract_steps("a", [TERMS], [contract("b", "a", "active")], ["a", "b"]) == []
    ended = contract("a", "b", "terminated")
    assert [s.action for s in contract_steps("a", [TERMS], [ended], ["a", "b"])] == ["propose"]
