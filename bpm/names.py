"""Names that become folders, file names and subjects, and the paths built from them.

A participant's or a task's name travels from one organisation to another: the registry
refuses any name outside `NAME_PATTERN`, and every agent checks again before a name
becomes a path (`inside`), because the other side may be hostile. A name that matches
is one path component: no separator, never `.` or `..`, no leading dot or dash.

A task's key is "origin.name". A participant's name has no dot, so the key splits at its
first dot one way only: `acme`'s task `eu.p0` and a participant `acme.eu`'s task `p0`
cannot both be `acme.eu.p0` (they would share output subjects, checkpoints and replicas).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
PARTICIPANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
PARTICIPANT_MAX = 64
TASK_MAX = 128
# A task's federation-wide key is "origin.name".
KEY_MAX = PARTICIPANT_MAX + 1 + TASK_MAX

_NAME = re.compile(NAME_PATTERN)
_PARTICIPANT = re.compile(PARTICIPANT_PATTERN)


class UnsafeName(ValueError):
    """A name that could escape a folder or a subject; the message says which and why."""


def check_name(value: object, what: str = "name", max_length: int = KEY_MAX) -> str:
    """`value` when it is a safe name of at most `max_length` characters, else UnsafeName."""
    if not isinstance(value, str) or not 0 < len(value) <= max_length or not _NAME.fullmatch(value):
        raise UnsafeName(
            f"bad {what} {value!r}: 1 to {max_length} letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def check_participant(value: object) -> str:
    """`value` when it is a participant's name (a safe name without a dot), else UnsafeName."""
    if not isinstance(value, str) or not 0 < len(value) <= PARTICIPANT_MAX or not _PARTICIPANT.fullmatch(value):
        raise UnsafeName(
            f"bad participant name {value!r}: 1 to {PARTICIPANT_MAX} letters, digits, '_' or '-', starting with a letter or digit"
        )
    return value


def is_participant(value: object) -> bool:
    try:
        check_participant(value)
    except UnsafeName:
        return False
    return True


def task_key(task: Mapping) -> str:
    """The federation-wide name of a task: stable across hosts, used for its output and checkpoint."""
    return f"{check_participant(task['origin'])}.{check_name(task['name'], 'task name', TASK_MAX)}"


def inside(root: Path, *names: str) -> Path:
    """`root/names...` after checking each name, resolved; refuses a result outside `root`
    (for example through a symbolic link planted under it)."""
    base = Path(root).resolve()
    path = base.joinpath(*(check_name(n, "path component") for n in names)).resolve()
    if path != base and base not in path.parents:
        raise UnsafeName(f"{path} is outside {base}")
    return path
