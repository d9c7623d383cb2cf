"""A participant's own broker as its agent runs it: the server, its owner, and the partners it lets in.

The agent starts its participant's NATS server (`NatsServer`, storage in the agent's own
work folder) with one user for itself. A partner gets a user of its own, with a password
this participant makes up and keeps (`partners.json`, readable by its owner only), and
permissions for exactly the tasks of this participant it hosts (`partner_user`): read their
key groups, write their results; or, for a partner holding an active-standby replica of a
task, read its key groups only. The agent derives those grants from what the registry
says (`grant`), and the partner asks for its password over HTTP with a token the registry
issued to the task's host (`GET /broker/{task}`, `spark_agents.server`): nobody reads this
participant's stream but as a user the registry vouched for.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import ssl
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

import nats

from bpm.keygroups import MAIN, StreamLocation, token
from bpm.names import check_participant
from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.subjects import consumer_tag, partner_user
from spark_agents.broker.source import JetStreamInput
from spark_agents.credentials import write_private
from spark_agents.races import Refused
from spark_agents.tls import OwnCertificate

log = logging.getLogger(__name__)
# A task's share of its origin's stream: (input, key-group prefix) (`bpm.keygroups.StreamLocation.share`).
Share = tuple[str, str]
# partner -> (task key, share, whether it writes the task's results: it hosts it) it may read
Grants = Mapping[str, Iterable[tuple[str, Share, bool]]]
CONSUMERS_PER_TASK = 8  # a partner's readers of one task's key groups at once: the driver's and each partition's


class OwnBroker:
    """Participant `name`'s broker (see the module text).

    Attributes:
        url: where partners reach it (`nats://ADVERTISE:PORT`).
        password: the owner user's (the agent's own) password.
        tls: the certificate (PEM) it serves TLS with, the one the agent serves and registers
            (`spark_agents.tls.own_certificate`): partners pin it as they pin the agent's;
            None: plain text (`--insecure`).
    """

    def __init__(self, name: str, folder: Path, password: str, *, host: str = "127.0.0.1", port: int, http_port: int,
                 advertise: str | None = None, tls: OwnCertificate | None = None) -> None:
        self.name = check_participant(name)
        self.folder = Path(folder)
        self.password = password
        self.url = f"nats://{advertise or host}:{port}"
        self.tls = None if tls is None else tls.pem
        self.server = NatsServer(name, self.folder / "store", port=port, http_port=http_port, users=[self._owner()], host=host, tls=tls)
        self._grants: dict[str, frozenset[tuple[str, Share, bool]]] = {}
        self._readers: frozenset[str] = frozenset()  # partners that read the alerts this participant shares
        self._lock = threading.RLock()  # over the grants, the partners' passwords and the owner's connection
        self._owner_connection = None
        self._retention = None

    def _owner(self) -> User:
        return User(self.name, self.password)

    def start(self) -> OwnBroker:
        """Start the server, with the participant's input stream and results stream in it:
        a task may start before anything was published."""
        from spark_agents.broker.results import ensure_results
        from spark_agents.broker.stream import Broker

        self.folder.mkdir(parents=True, exist_ok=True)
        self.server.start()
        try:
            with Broker(self.server.url, self.name, self.password, tls=self.tls) as owner:
                owner.ensure_stream(self.name)
                ensure_results(owner)
                unread = unnamed_input_messages(owner, self.name)
        except BaseException:
            self.server.stop()
            raise
        if unread:
            log.warning("%s: its stream holds %d messages published before its inputs had names (in.%s.<bits>): no task reads "
                        "them; publish that input again (bpm replay --stream %s)", self.name, unread, token(self.name), self.location())
        return self

    def stop(self) -> None:
        with self._lock:
            if self._owner_connection is not None:
                self._owner_connection.close()
                self._owner_connection = self._retention = None
        self.server.stop()

    def connection(self):
        """This agent's connection to its server as the owner (`spark_agents.broker.stream.Broker`), made on first use and kept."""
        from spark_agents.broker.retention import Retention
        from spark_agents.broker.stream import Broker

        with self._lock:
            if self._owner_connection is None or self._owner_connection.nc.is_closed:
                self._owner_connection = Broker(self.server.url, self.name, self.password, tls=self.tls)
                self._retention = Retention(self._owner_connection, self.name)
            return self._owner_connection

    def retention(self):
        """The acknowledgements of this participant's stream (`spark_agents.broker.retention.Retention`), as its owner."""
        with self._lock:
            self.connection()
            return self._retention

    def location(self, prefix: str = "", input: str = MAIN) -> str:
        """The location of key groups `prefix` of input `input` of this participant's stream, as a task record holds it."""
        return str(StreamLocation(self.url, self.name, prefix, input))

    def own_input(self, where: StreamLocation) -> JetStreamInput:
        """A task of this participant's reads its own stream as the owner."""
        return JetStreamInput.at(where, self.name, self.password, tls=self.tls)

    def grant(self, hosted: Grants, readers: Iterable[str] | None = None) -> bool:
        """Let each partner read the key groups and write the results of exactly the tasks it
        hosts, and read the key groups of the tasks it replicates, and the partners in
        `readers` read the alerts this participant shares (None: those who read them so far);
        nobody else anything. Reloads the server only when that changed. Returns whether it did."""
        wanted = {check_participant(p): frozenset(tasks) for p, tasks in hosted.items() if p != self.name}
        wanted = {p: tasks for p, tasks in wanted.items() if tasks}
        with self._lock:
            alerts = self._readers if readers is None else frozenset(check_participant(p) for p in readers) - {self.name}
            if wanted == self._grants and alerts == self._readers:
                return False
            users = [self._owner()] + [partner_user(p, self._password(p), sorted(wanted.get(p, ())), alerts=p in alerts)
                                       for p in sorted(set(wanted) | alerts)]
            self.server.reload(users)
            self._grants, self._readers = wanted, alerts
            return True

    def sweep(self) -> list[str]:
        """Delete the consumers of this participant's input stream that no grant covers now,
        and return their names. A partner reads through consumers it makes on the filters of
        its grants (`partner_user`), named with its tag (`consumer_tag`); the server cannot
        forget them when a grant ends, so the agent sweeps when one ends, and every `SWEEP_S`:

        - a partner's consumer over key groups it no longer hosts or replicates: a revoked
          grant stops delivering at once;
        - a consumer whose name bears no user's tag (nobody may make one in another's name);
        - a consumer kept beyond a reader's life (durable, or idle longer than `READER_IDLE_S`);
        - a partner's consumers beyond `CONSUMERS_PER_TASK` over one task's key groups, oldest first.

        The owner's own consumers stay."""
        from bpm.keygroups import subject_filter
        from spark_agents.broker.source import READER_IDLE_S
        from spark_agents.broker.subjects import INPUT

        broker = self.connection()

        async def listed():
            out, offset = [], 0
            while True:
                page = await broker.js.consumers_info(INPUT, offset=offset)
                out += page
                offset += len(page)
                if not page or len(page) < 256:
                    return out

        # The grants are read after the consumers: one granted meanwhile made none of those listed.
        consumers = broker.call(listed())
        with self._lock:
            grants = dict(self._grants)
            tags = {consumer_tag(p, pw): p for p, pw in self._passwords().items()}
        own = consumer_tag(self.name, self.password)
        filters = {p: {subject_filter(self.name, prefix, input) for _, (input, prefix), _ in tasks} for p, tasks in grants.items()}
        doomed, kept = [], {}
        for info in sorted(consumers, key=lambda i: i.created.timestamp() if i.created else 0.0):
            tag = info.name.partition("-")[0]
            if tag == own:
                continue
            partner = tags.get(tag)
            config = info.config
            if (partner is None or config.filter_subject not in filters.get(partner, ()) or config.durable_name
                    or not config.inactive_threshold or config.inactive_threshold > READER_IDLE_S):
                doomed.append(info.name)
            else:
                kept.setdefault((partner, config.filter_subject), []).append(info.name)
        for names in kept.values():
            doomed += names[:max(0, len(names) - CONSUMERS_PER_TASK)]

        async def delete() -> None:
            for name in doomed:
                try:
                    await broker.js.delete_consumer(INPUT, name)
                except nats.js.errors.NotFoundError:
                    pass  # gone by itself meanwhile

        if doomed:
            broker.call(delete())
        return doomed

    def granted(self) -> dict[str, frozenset[tuple[str, Share, bool]]]:
        with self._lock:
            return dict(self._grants)

    def credentials(self, partner: str) -> dict[str, str]:
        """What `partner` connects with: this broker's address, its user and password."""
        return {"url": self.url, "user": partner, "password": self._password(partner)}

    def _passwords(self) -> dict[str, str]:
        """The partners' passwords made up so far (`partners.json`, owner-only)."""
        try:
            return json.loads((self.folder / "partners.json").read_text())
        except FileNotFoundError:
            return {}

    def _password(self, partner: str) -> str:
        """`partner`'s password, made up the first time and kept in `partners.json`."""
        with self._lock:
            known = self._passwords()
            if partner not in known:
                known[partner] = secrets.token_urlsafe(24)
                write_private(self.folder / "partners.json", json.dumps(known))
            return known[partner]


_PASSWORD = re.compile(r"^[A-Za-z0-9_-]{8,200}$")


def unnamed_input_messages(owner, participant: str) -> int:
    """How many messages `participant`'s stream holds on the subjects of a stream of one
    unnamed input (`in.<participant>.<bit>...`, before `bpm.keygroups` named inputs), which
    no filter of a named input selects (`owner`: its owner's connection)."""
    from spark_agents.broker.subjects import INPUT

    counts = [owner.call(owner.js.stream_info(INPUT, subjects_filter=f"in.{token(participant)}.{bit}.>")).state.subjects or {}
              for bit in "01"]
    return sum(n for subjects in counts for n in subjects.values())


def ask_agent(endpoint: str, path: str, token: str, what: str, me: str, *, params: Mapping[str, object] | None = None,
              refusals: Mapping[int, type[Exception]] | None = None, timeout_s: float = 30.0, verify: ssl.SSLContext | bool = True) -> dict:
    """The JSON object another agent at `endpoint` answers to GET `path`, asked with the
    registry's `token` for the call (over TLS that shows what `verify` checks,
    `spark_agents.tls.Peers.verify`), checked to hold credentials for this participant, `me`:
    the user `me` and a plain token as password. A status in `refusals` raises its exception;
    anything else that goes wrong a RuntimeError (`what` says what was asked, in the message)."""
    import httpx

    try:
        response = httpx.get(f"{endpoint.rstrip('/')}{path}", params=params, timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}, verify=verify)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot ask {endpoint} for {what}: {exc}") from exc
    if response.status_code in (refusals or {}):
        raise refusals[response.status_code](f"{endpoint} refuses {what}: {response.text[:200]}")
    if response.status_code != 200:
        raise RuntimeError(f"{endpoint} refuses {what}: {response.status_code} {response.text[:200]}")
    try:
        body = response.json()
        body["user"], body["password"]
    except (ValueError, KeyError, TypeError):
        raise RuntimeError(f"{endpoint} answered {what} with something else than credentials") from None
    if body["user"] != me or not isinstance(body["password"], str) or not _PASSWORD.match(body["password"]):
        raise RuntimeError(f"{endpoint} answered {what} with credentials that are not {me}'s")
    return body


def ask_credentials(endpoint: str, key: str, epoch: int, token: str, me: str, *, timeout_s: float = 30.0,
                    verify: ssl.SSLContext | bool = True) -> tuple[str, str]:
    """(user, password) with which this participant, `me`, reads task `key`'s share of its
    origin's stream: asked of the origin's agent at `endpoint` with the registry's token for
    the call (purpose `stream`). What the origin answers is checked before use: the user
    must be `me`, the password a plain token. A refusal because the registry places the
    task elsewhere now is `Refused` (a lost race); anything else a RuntimeError."""
    what = f"the stream of {key} at epoch {epoch}"
    body = ask_agent(endpoint, f"/broker/{key}", token, what, me, params={"epoch": epoch}, refusals={409: Refused},
                     timeout_s=timeout_s, verify=verify)
    return body["user"], body["password"]
