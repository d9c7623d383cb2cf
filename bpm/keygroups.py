"""Key groups: how a participant's input stream is divided, and how a task names its share.

A participant's stream has `KEY_GROUPS` (64) key groups; a row belongs to key group
`crc32(source prefix) mod 64`, so every row of one source lands in one key group and a
per-source aggregate needs no rows from any other. The subject of key group `g` spells its
six bits one token each, most significant first: `in.<participant>.0.1.1.0.1.0` (a `.` in
the participant's name becomes `~`, which no name holds: one token, and no two names alike). A task
covers the key groups whose bits start with a prefix — `""` for all, `"0"` for the first
half, `"01"` for its second quarter, and so on — so that splitting a task in two is adding
a bit, merging two halves is removing one, and a task's share of the stream is one subject
filter with a wildcard (`in.<participant>.0.1.>`), which a single JetStream consumer takes.
"""

from __future__ import annotations

import re
import zlib

from bpm.names import PARTICIPANT_MAX, check_name

BITS = 6
KEY_GROUPS = 1 << BITS
_PREFIX = re.compile(r"^[01]{0,%d}$" % BITS)


class KeyGroupError(ValueError):
    """A key-group prefix or number that names no share of a stream."""


def key_group(source_prefix: str) -> int:
    """The key group of a row whose source has prefix `source_prefix`."""
    return zlib.crc32(source_prefix.encode()) % KEY_GROUPS


def check_prefix(prefix: str) -> str:
    """`prefix` if it names a share of the key groups (up to six bits), else KeyGroupError."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise KeyGroupError(f"bad key-group prefix {prefix!r}: up to {BITS} bits, 0 or 1 each ('' for every key group)")
    return prefix


def bits(group: int) -> str:
    if not 0 <= group < KEY_GROUPS:
        raise KeyGroupError(f"key group {group} is not in 0..{KEY_GROUPS - 1}")
    return format(group, f"0{BITS}b")


def token(participant: str) -> str:
    """`participant` as one subject token."""
    return check_name(participant, "participant name", PARTICIPANT_MAX).replace(".", "~")


def subject(participant: str, group: int) -> str:
    """The subject rows of key group `group` of `participant`'s stream are published on."""
    return ".".join(("in", token(participant), *bits(group)))


def stream_subjects(participant: str) -> str:
    """The subjects of `participant`'s whole stream (one wildcard)."""
    return subject_filter(participant, "")


def subject_filter(participant: str, prefix: str) -> str:
    """The one subject filter that selects the key groups starting with `prefix`."""
    head = ".".join(("in", token(participant), *check_prefix(prefix)))
    return head + (".>" if len(prefix) < BITS else "")


def groups(prefix: str) -> range:
    """The key groups whose bits start with `prefix`, in order."""
    check_prefix(prefix)
    span = 1 << (BITS - len(prefix))
    first = int(prefix, 2) * span if prefix else 0
    return range(first, first + span)


def halves(prefix: str) -> tuple[str, str]:
    """The two shares a task over `prefix` splits into."""
    if len(check_prefix(prefix)) == BITS:
        raise KeyGroupError(f"key groups {prefix!r} are one key group: they do not split")
    return prefix + "0", prefix + "1"
