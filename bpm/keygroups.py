"""Key groups: how a participant's input stream is divided, and how a task names its share.

A participant's stream has `KEY_GROUPS` (64) key groups; a row belongs to key group
`crc32(key) mod 64`, so every row of one key lands in one key group and a per-key
computation needs no rows from any other.

A participant's stream holds one or more inputs, each named (`check_input`; `main` unless
its agent names more, one per query of its own, `bpm.query`), each divided into key groups.
The subject of key group `g` of input `i` spells its six bits one token each, most
significant first: `in.<participant>.<i>.0.1.1.0.1.0`. A task covers the key groups of one
input whose bits start with a prefix — `""` for all, `"0"` for the first half, `"01"` for
its second quarter, and so on — so that splitting a task in two is adding a bit, merging
two halves is removing one, and a task's share of the stream is one subject filter with a
wildcard (`in.<participant>.<i>.0.1.>`), which a single JetStream consumer takes and which
selects nothing of another input: an input's name is one token and no bit.

A task's record names its share as a location, `nats://HOST:PORT/PARTICIPANT[/INPUT][/PREFIX]`
(`StreamLocation`; no INPUT: `main`): the server, whose stream, which input, which key
groups; never a credential.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from bpm.names import PARTICIPANT_MAX, check_name, check_participant

BITS = 6
KEY_GROUPS = 1 << BITS
_PREFIX = re.compile(r"^[01]{0,%d}$" % BITS)
MAIN = "main"  # the input of a participant whose agent names no other
INPUT_MAX = 32
_INPUT = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,%d}$" % (INPUT_MAX - 1))


class KeyGroupError(ValueError):
    """A key-group prefix or number that names no share of a stream."""


def key_group(key: str) -> int:
    """The key group of a row whose key's text is `key` (`bpm.records.Records.key_group`)."""
    return zlib.crc32(key.encode()) % KEY_GROUPS


def check_prefix(prefix: str) -> str:
    """`prefix` if it names a share of the key groups (up to six bits), else KeyGroupError."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise KeyGroupError(f"bad key-group prefix {prefix!r}: up to {BITS} bits, 0 or 1 each ('' for every key group)")
    return prefix


def check_input(name: object) -> str:
    """`name` if it names an input of a participant's stream (a letter, then up to 31 letters,
    digits, '_' or '-': one subject token, never a key group's bit), else KeyGroupError."""
    if not isinstance(name, str) or not _INPUT.fullmatch(name):
        raise KeyGroupError(f"bad input name {name!r}: a letter, then up to {INPUT_MAX - 1} letters, digits, '_' or '-'")
    return name


def bits(group: int) -> str:
    if not 0 <= group < KEY_GROUPS:
        raise KeyGroupError(f"key group {group} is not in 0..{KEY_GROUPS - 1}")
    return format(group, f"0{BITS}b")


def token(participant: str) -> str:
    """`participant` as one subject token."""
    return check_name(participant, "participant name", PARTICIPANT_MAX).replace(".", "~")


def subject(participant: str, group: int, input: str = MAIN) -> str:
    """The subject rows of key group `group` of input `input` of `participant`'s stream are published on."""
    return ".".join(("in", token(participant), check_input(input), *bits(group)))


def stream_subjects(participant: str) -> str:
    """The subjects of `participant`'s whole stream, every input (one wildcard)."""
    return f"in.{token(participant)}.>"


def subject_filter(participant: str, prefix: str, input: str = MAIN) -> str:
    """The one subject filter that selects the key groups of input `input` starting with `prefix`."""
    head = ".".join(("in", token(participant), check_input(input), *check_prefix(prefix)))
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
    """Key groups `prefix` of input `input` of `participant`'s stream on the server at `url` (`nats://host:port`)."""

    url: str
    participant: str
    prefix: str = ""
    input: str = MAIN

    def __str__(self) -> str:
        return (f"{self.url}/{self.participant}" + (f"/{self.input}" if self.input != MAIN else "")
                + (f"/{self.prefix}" if self.prefix else ""))

    @property
    def filter(self) -> str:
        """The subject filter of these key groups (`subject_filter`)."""
        return subject_filter(self.participant, self.prefix, self.input)

    @property
    def share(self) -> tuple[str, str]:
        """(input, key-group prefix): which rows of the participant's stream these are."""
        return self.input, self.prefix


def is_location(uri: str) -> bool:
    """Whether a task's input names a broker stream (parsed by `parse_location`)."""
    return uri.startswith(SCHEME)


_LOCATION = re.compile(r"^nats://(?P<host>[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})(?:/(?P<path>[^?#@]*))?$")


def parse_location(location: str) -> StreamLocation:
    """`nats://host:port/participant[/input][/prefix]` as a StreamLocation; ValueError when it is not one.

    Credentials never ride in a location (it shows in records and process lists): a
    participant's own password comes from `BPM_NATS_PASSWORD`, a partner's from the origin.
    """
    if not isinstance(location, str):
        raise ValueError(f"bad broker location {location!r}")
    if location.startswith(SCHEME) and any(c in location for c in "@?#"):
        raise ValueError(f"bad broker location {location!r}: no credentials or query in it (a password comes from {PASSWORD_ENV})")
    m = _LOCATION.match(location)
    if m is None or not 1 <= int(m.group("port")) <= 65535:
        raise ValueError(f"bad broker location {location!r}: nats://HOST:PORT/PARTICIPANT[/INPUT][/KEY_GROUP_PREFIX]")
    participant, *rest = (m.group("path") or "").strip("/").split("/")
    # An input's name begins with a letter and a prefix is bits: the path reads one way only.
    input = rest.pop(0) if rest and rest[0][:1].isalpha() else MAIN
    try:
        check_participant(participant)
        check_input(input)
        if len(rest) > 1:
            raise KeyGroupError(f"{'/'.join(rest)!r} is more than one key-group prefix")
        prefix = check_prefix(rest[0] if rest else "")
    except ValueError as exc:
        raise ValueError(f"bad broker location {location!r}: {exc}") from None
    return StreamLocation(f"nats://{m.group('host')}:{int(m.group('port'))}", participant, prefix, input)
