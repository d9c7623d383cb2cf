"""A participant's broker, named: its streams, the subjects in them, and which of them a
partner's user may touch. The server (`spark_agents.broker.server`) enforces what these say;
the stream, the results and the alerts (`stream`, `results`, `spark_agents.correlation`)
publish and read by them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from bpm.keygroups import subject_filter, token
from bpm.names import check_name
from spark_agents.broker.server import User

INPUT = "INPUT"  # the participant's input rows, one subject per key group (`bpm.keygroups.subject`)
RESULTS = "RESULTS"  # its tasks' results, one subject per task (`results_subject`)
ALERTS = "ALERTS"  # the alerts it shares with its partners (`spark_agents.correlation`)
CORRELATED = "CORRELATED"  # the correlated result, where this participant correlates


def results_subject(task_id: str) -> str:
    """The subject of task `origin.name`'s results on its origin's server."""
    origin, _, name = check_name(task_id, "task key").partition(".")
    return f"out.{token(origin)}.{token(name)}"


def partner_user(name: str, password: str, granted: Iterable[tuple[str, str, bool]], *, alerts: bool = False) -> User:
    """The user a contract partner connects as: it reads only the key groups of the tasks it
    hosts or replicates and writes only the results of those it hosts. `granted` holds
    (task key, (input, key-group prefix), whether it writes the results) triples. With `alerts` it
    also reads the alerts this participant shares (`spark_agents.correlation`): the state
    and the messages of the stream `ALERTS`, nothing it could write.

    Reading is creating a consumer on the input stream, which JetStream's API subject names
    with its filter (`$JS.API.CONSUMER.CREATE.INPUT.<consumer>.<filter>`), so a filter
    outside the hosted key groups is refused by the server; then pulling from a consumer and
    deleting it, by its name, which begins with the user's secret tag and ends with a random
    part (`spark_agents.broker.source`): no listing, and no other consumer's state, so no
    partner learns another's consumer's name. Writing results is publishing on the task's results subject and reading
    that subject's last message (the fence), by a direct get whose request subject names the
    results subject: no other message of the results stream, by sequence or subject, can be
    read. Replies come to the user's own inboxes only.
    """
    publish = [f"$JS.API.CONSUMER.MSG.NEXT.{INPUT}.*", f"$JS.API.CONSUMER.DELETE.{INPUT}.*"]
    for task, (input, prefix), writes in granted:
        origin = task.partition(".")[0]
        publish += [f"$JS.API.CONSUMER.CREATE.{INPUT}.*.{subject_filter(origin, prefix, input)}"]
        if writes:
            publish += [results_subject(task), f"$JS.API.DIRECT.GET.{RESULTS}.{results_subject(task)}"]
    if alerts:
        publish += [f"$JS.API.STREAM.INFO.{ALERTS}", f"$JS.API.STREAM.MSG.GET.{ALERTS}"]
    return User(name, password, publish=tuple(publish), subscribe=(f"{inbox_prefix(name)}.>",))


def consumer_tag(user: str, password: str) -> str:
    """What begins the name of every consumer `user` makes (`spark_agents.broker.source`): a
    digest of its name and password, so that the origin, which knows its partners'
    passwords, tells whose each consumer is, and no partner can make one in another's name
    (`spark_agents.broker.access.OwnBroker.sweep`)."""
    return hashlib.sha256(f"{user}\0{password}".encode()).hexdigest()[:20]


def inbox_prefix(user: str) -> str:
    """Where `user`'s replies arrive: its own inboxes, so that no user can listen to another's."""
    return f"_INBOX.{check_name(user, 'user name').replace('.', '~')}"
