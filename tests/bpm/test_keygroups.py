"""Key groups: every row in exactly one, a task's share one subject filter, halves that add up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpm.keygroups import (
    KEY_GROUPS,
    MAIN,
    KeyGroupError,
    StreamLocation,
    groups,
    halves,
    is_location,
    key_group,
    parse_location,
    shares,
    stream_subjects,
    subject,
    subject_filter,
)


def _matches(filter_: str, subject_: str) -> bool:
    """NATS subject matching: `*` one token, `>` one or more at the end."""
    f, s = filter_.split("."), subject_.split(".")
    for i, token in enumerate(f):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(f) == len(s)


@given(st.text(min_size=0, max_size=20))
def test_every_source_prefix_has_one_key_group(prefix):
    assert 0 <= key_group(prefix) < KEY_GROUPS
    assert key_group(prefix) == key_group(prefix)


@given(st.text("01", max_size=6), st.integers(0, KEY_GROUPS - 1), st.sampled_from([MAIN, "sensors", "s-2"]),
       st.sampled_from([MAIN, "sensors", "s-2"]))
def test_a_share_s_filter_selects_exactly_its_key_groups_of_its_input(prefix, group, input, other):
    assert _matches(subject_filter("a", prefix, input), subject("a", group, other)) == (group in groups(prefix) and input == other)
    assert _matches(stream_subjects("a"), subject("a", group, other))
    assert subject_filter("a", prefix) == subject_filter("a", prefix, MAIN)


def test_halves_partition_a_share_and_one_group_does_not_split():
    assert list(groups("")) == list(range(64))
    low, high = halves("01")
    assert (low, high) == ("010", "011")
    assert list(groups(low)) + list(groups(high)) == list(groups("01"))
    assert subject_filter("a", "010101") == subject("a", 0b010101)
    with pytest.raises(KeyGroupError):
        halves("010101")


def test_names_with_dots_stay_one_token_and_bad_input_is_refused():
    assert subject("org.a", 5) == "in.org~a.main.0.0.0.1.0.1"
    assert not _matches(subject_filter("org", ""), subject("org.a", 5))
    for bad in ("0", "1x", "", "in.put", "a>", "*", "x" * 33, None):
        with pytest.raises(KeyGroupError, match="input name"):
            subject("a", 5, bad)
    for bad in ("2", "0101010", "0 1", None):
        with pytest.raises(KeyGroupError):
            subject_filter("a", bad)
    with pytest.raises(ValueError):
        subject("a>b", 1)
    with pytest.raises(KeyGroupError):
        subject("a", 64)


def test_shares_split_a_stream_evenly_and_only_in_powers_of_two():
    assert shares(1) == [""] and shares(4) == ["00", "01", "10", "11"]
    assert sorted(g for prefix in shares(8) for g in groups(prefix)) == list(range(KEY_GROUPS))
    for bad in (0, 3, 65, 128):
        with pytest.raises(KeyGroupError):
            shares(bad)


def test_a_location_names_a_server_a_participant_and_key_groups_and_never_a_credential():
    where = parse_location("nats://10.0.0.2:4222/org-a/01")
    assert where == StreamLocation("nats://10.0.0.2:4222", "org-a", "01") and str(where) == "nats://10.0.0.2:4222/org-a/01"
    assert parse_location(str(StreamLocation("nats://h:1", "a"))) == StreamLocation("nats://h:1", "a", "")
    assert is_location("nats://h:1/a") and not is_location("/streams/a")
    assert parse_location("nats://[::1]:4222/a/1") == StreamLocation("nats://[::1]:4222", "a", "1")
    # A named input sits between the participant and the key groups; the main one is not written.
    assert str(StreamLocation("nats://h:1", "a", "01", MAIN)) == "nats://h:1/a/01"
    for text, where in [("nats://h:1/a/sensors/01", StreamLocation("nats://h:1", "a", "01", "sensors")),
                        ("nats://h:1/a/sensors", StreamLocation("nats://h:1", "a", "", "sensors"))]:
        assert parse_location(text) == where and str(where) == text
        assert where.filter == subject_filter("a", where.prefix, "sensors") and where.share == ("sensors", where.prefix)
    for bad, why in [("nats://h/a", "HOST:PORT"), ("http://h:1/a", "HOST:PORT"), ("nats://u:p@h:1/a", "no credentials"),
                     ("nats://h:1/a?x=1", "no credentials"), ("nats://h:1/../etc", "participant"), ("nats://h:1/a.b/0", "participant"), ("nats://h:1/a/012", "key-group"),
                     ("nats://h:1/a/0/1", "key-group"), ("nats://h:99999/a", "HOST:PORT"), ("nats://h:0/a", "HOST:PORT"),
                     ("nats://h h:1/a", "HOST:PORT"), ("nats://h:1", "participant"), ("nats://h:1/a/s.x/0", "input name"),
                     ("nats://h:1/a/sensors/0/1", "more than one"), ("nats://h:1/a/sensors/x", "key-group")]:
        with pytest.raises(ValueError, match=why):
            parse_location(bad)
