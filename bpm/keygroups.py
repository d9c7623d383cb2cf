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

A task's record names its share as a location, `nats://HOST:PORT/PARTICIPANT[/PREFIX]`
(`StreamLocation`): the server, whose stream, which key groups; never a credential.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from bpm.names import PARTICIPANT_MAX, check_name, check_participant

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


def shares(n: int) -> list[str]:
    """The prefixes of `n` equal shares of a stream (`n` a power of two up to 64): 4 -> ['00', '01', '10', '11']."""
    if not 1 <= n <= KEY_GROUPS or n & (n - 1):
        raise KeyGroupError(f"a stream splits into a power of two of shares, 1 to {KEY_GROUPS}, not {n}")
    width = n.bit_length() - 1
    return [format(k, f"0{width}b") if width else "" for k in range(n)]


def halves(prefix: str) -> tuple[str, str]:
    """The two shares a task over `prefix` splits into."""
    if len(check_prefix(prefix)) == BITS:
        raise KeyGroupError(f"key groups {prefix!r} are one key group: they do not split")
    return prefix + "0", prefix + "1"


def merged(first: str, second: str) -> str:
    """The share two halves merge back into (`halves`' inverse); KeyGroupError when they are not one share's halves."""
    if not check_prefix(first) or sorted((first, check_prefix(second))) != list(halves(first[:-1])):
        raise KeyGroupError(f"key groups {first!r} and {second!r} are not the two halves of one share")
    return first[:-1]


PASSWORD_ENV = "BPM_NATS_PASSWORD"
SCHEME = "nats://"


@dataclass(frozen=True)
class StreamLocation:
    """Key groups `prefix` of `participant`'s stream on the server at `url` (`nats://host:port`)."""

    url: str
    participant: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"{self.url}/{self.participant}" + (f"/{self.prefix}" if self.prefix else "")


def is_location(uri: str) -> bool:
    """Whether a task's input names a broker stream (parsed by `parse_location`)."""
    return uri.startswith(SCHEME)


_LOCATION = re.compile(r"^nats://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})(?:/(?P<path>[^?#@]*))?$")


def parse_location(location: str) -> StreamLocation:
    """`nats://host:port/participant[/prefix]` as a StreamLocation; ValueError when it is not one.

    Credentials never ride in a location (it shows in records and process lists): a
    participant's own password comes from `BPM_NATS_PASSWORD`, a partner's from the origin.
    """
    if not isinstance(location, str):
        raise ValueError(f"bad broker location {location!r}")
    if location.startswith(SCHEME) and any(c in location for c in "@?#"):
        raise ValueError(f"bad broker location {location!r}: no credentials or query in it (a password comes from {PASSWORD_ENV})")
    m = _LOCATION.match(location)
    if m is None or not 1 <= int(m.group("port")) <= 65535:
        raise ValueError(f"bad broker location {location!r}: nats://HOST:PORT/PARTICIPANT[/KEY_GROUP_PREFIX]")
    participant, _, prefix = (m.group("path") or "").strip("/").partition("/")
    try:
        check_participant(participant)
        check_prefix(prefix)
    except ValueError as exc:
        raise ValueError(f"bad broker location {location!r}: {exc}") from None
    return StreamLocation(f"nats://{m.group('host')}:{int(m.group('port'))}", participant, prefix)
