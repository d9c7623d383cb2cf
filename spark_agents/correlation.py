"""The correlated result live: alerts shared over the participants' brokers, DPC at the correlating participant.

Each participant that opts in publishes its alerts for every window it closes on its own
broker, in the stream `ALERTS` (subject `alerts.<participant>.<window start>`, one
message per window, its sources, empty or not: an empty message says the window is
closed). A partner it shares with reads that stream as a user of its own that may read
`ALERTS` and nothing else (`alerts_reader`), with a password the sharing participant makes
up and gives it. The correlating participant follows its own stream and each partner's
(`follow`, `LiveCorrelator`), turns what arrives into `bpm.dpc` events, and publishes every version the
machine decides in the stream `CORRELATED` of its own broker (subject
`corr.<window start>`, deduplicated by window and version), from which `read_correlated`
rebuilds the versions in order.

Nothing a partner sends is trusted: a message that does not parse, names another
participant than the broker's owner, a window of zero or more than a day, or a source that
is not an IP address is recorded as refused and skipped (`parse_alerts`).

Under a partition the partner's broker does not answer; the follower keeps trying (a
connection that reconnects on its own, requests with short timeouts) and, once the link
heals, reads on from the next message it has not seen: what the partner closed meanwhile
arrives in order, late, and corrects the tentative windows.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import nats
from nats.js.api import StorageType, StreamConfig

from bpm.dpc import Alert, Alerts, CorrelatedRow, Correlator, Ignored, Members, Publish, Tick
from bpm.keygroups import token
from bpm.names import check_name
from spark_agents.broker.server import User
from spark_agents.broker.subjects import ALERTS, CORRELATED, partner_user
from spark_agents.broker.stream import Broker, connect

log = logging.getLogger(__name__)

MAX_WINDOW_S = 86_400
MAX_SOURCES = 100_000


@dataclass(frozen=True)
class Endpoint:
    """Where a broker is and who connects to it; over TLS pinned to the certificate `tls`
    (PEM; None: plain text, `spark_agents.broker.stream.Broker`)."""

    url: str
    user: str
    password: str = field(repr=False)
    tls: str | None = field(default=None, repr=False)


def alerts_reader(partner: str, password: str) -> User:
    """The user `partner` reads this participant's alerts as: the stream's state and its messages, nothing else."""
    return partner_user(partner, password, (), alerts=True)


def ensure_streams(broker: Broker, *, correlated: bool) -> None:
    """Create `ALERTS` (and `CORRELATED` when this participant correlates) on its own broker."""

    async def ensure() -> None:
        wanted = [(ALERTS, "alerts.>")] + ([(CORRELATED, "corr.>")] if correlated else [])
        for name, subjects in wanted:
            try:
                await broker.js.stream_info(name)
            except nats.js.errors.NotFoundError:
                await broker.js.add_stream(StreamConfig(name=name, subjects=[subjects], storage=StorageType.FILE,
                                                        duplicate_window=600.0))

    broker.call(ensure())


def share_alerts(broker: Broker, participant: str, window: tuple[int, int], sources: Iterable[str]) -> int:
    """Publish `participant`'s alerts for a closed window on its own broker; a second publish of the window is dropped."""
    start, end = window
    body = {"participant": participant, "window_start": start, "window_end": end, "sources": sorted(set(sources)), "final": True}
    subject = f"alerts.{token(participant)}.{start}"
    ack = broker.call(broker.js.publish(subject, json.dumps(body).encode(), stream=ALERTS,
                                        headers={"Nats-Msg-Id": f"{participant}.{start}"}))
    return ack.seq


class OwnAlerts:
    """A participant's alerts per closed window, read from its tasks' results on its own broker.

    Every task writes its rows and, once a window is closed at it, a progress mark
    (`spark_agents.broker.results`); wherever a task runs, its results go to its origin. A
    window is closed at the participant when every task that has written anything has
    closed it; then its alerts are final: the subjects that `alert` (its tasks' query's,
    `bpm.query.Query.alert`) finds in their results of that window, over all tasks, none
    when no task raised one. A task that never wrote anything (no input reached it) holds
    nothing back. `poll` returns the windows closed since the last poll,
    oldest first, each once, empty ones included: from the one after `shared_end` (the end
    of the last window shared before, by an earlier run of the agent) or else from the
    earliest window any task wrote on in the first poll that found something; a correlating
    partner does not wait for this participant's alerts of earlier windows
    (`bpm.dpc.Correlator.started`).

    A task's host writes what it likes on the task's results subject: a progress mark years
    ahead, or a result at time 0, would have the participant share every window up to it, or
    from it, without end. With `span` (`input_span`: what the participant's own input allows),
    a mark counts up to the newest window its input can have closed (read again only when a
    mark passes it), and while the first window is not known, a result of a window older than
    its input by more than the lateness and a window counts for nothing.

    Attributes:
        after: per task, the results sequence read up to.
        closed: per task, the end of the newest window it closed (None: none yet).
        sources: alerting sources of windows not returned yet.
        next_end: the end of the next window to return (None: not known yet).
    """

    def __init__(self, broker: Broker, window_s: int, alert: Alert, shared_end: int | None = None,
                 span: Span | None = None) -> None:
        from spark_agents.broker.results import Ceiling

        self.broker = broker
        self.window_s = window_s
        self.alert = alert
        self.floor, self.ceiling = (None, None) if span is None else (span.floor, Ceiling(span.bound))
        self.after: dict[str, int] = {}
        self.closed: dict[str, int | None] = {}
        self.sources: dict[tuple[int, int], set[str]] = {}
        self.next_end = None if shared_end is None else shared_end + window_s

    def poll(self, tasks: Iterable[str]) -> list[tuple[tuple[int, int], frozenset[str]]]:
        from bpm.dpc import alert_of
        from bpm.results import Result
        from spark_agents.broker.results import read_messages

        tasks = list(tasks)
        first = None  # the earliest window end written, while the first window is not known
        low, floor_read = None, False  # `floor`, read at the first message of a poll that looks for the first window
        for task in tasks:
            for seq, body, _ in read_messages(self.broker, task, self.after.get(task, 0)):
                self.after[task] = seq
                self.closed.setdefault(task, None)
                if self.next_end is None and self.floor is not None and not floor_read:
                    low, floor_read = self.floor(), True
                ends = []
                if body.get("kind") == "batch":
                    for result in map(Result.from_wire, body["rows"]):
                        if low is not None and result.time_us // 1_000_000 < low:
                            continue
                        ends.append(result.time_us // 1_000_000)
                        raised = alert_of(result, self.alert, self.window_s)
                        if raised is not None and (self.next_end is None or raised[0][1] >= self.next_end):
                            self.sources.setdefault(raised[0], set()).add(raised[1])
                elif body.get("kind") == "progress":
                    closed = body["closed_us"] // 1_000_000  # a window end: the tasks' query aligns at its window
                    if self.ceiling is not None and self.ceiling.passed_by(body["closed_us"]):
                        high = self.ceiling.value // 1_000_000  # an honest mark is a window end at or before it
                        closed = high - high % self.window_s
                    ends.append(closed)
                    self.closed[task] = max(self.closed[task] or closed, closed)
                if ends and self.next_end is None:
                    first = min([*ends, first] if first is not None else ends)
        if self.next_end is None:
            if first is None:
                return []
            self.next_end = first
        marks = [self.closed[t] for t in tasks if t in self.closed]
        if not marks or None in marks:
            return []
        out = []
        while self.next_end <= min(marks):
            window = (self.next_end - self.window_s, self.next_end)
            out.append((window, frozenset(self.sources.pop(window, ()))))
            self.next_end += self.window_s
        return out


@dataclass(frozen=True)
class Span:
    """What a participant's own input allows its tasks' results (`input_span`).

    Attributes:
        floor: the oldest window end a result can have, seconds (None: not known).
        bound: the newest time a result can be final at, microseconds (`final_bound`).
    """

    floor: Callable[[], "int | None"]
    bound: Callable[[], "int | None"]


def input_span(source, lateness_s: int, window_s: int) -> Span:
    """What `source` (`spark_agents.broker.source.JetStreamInput`, the participant's own input,
    read as its owner) allows its tasks' results: no window closes before the watermark
    (`spark_agents.broker.results.final_bound`); and a result's window holds records no older
    than the oldest the input held, which a trim of acknowledged records can have made newer
    than it was by the lateness and a window at most while results were owed."""
    from spark_agents.broker.results import final_bound

    def floor() -> int | None:
        oldest = source.oldest_time_us()
        return None if oldest is None else oldest // 1_000_000 - lateness_s - window_s

    return Span(floor, final_bound(source, lateness_s))


def parse_alerts(data: bytes, owner: str, at: float, window_s: int | None = None) -> Alerts:
    """A message of `owner`'s `ALERTS` stream as an event; ValueError saying what is wrong
    with it. With `window_s`, the window must be one of the correlation's: that long, and
    starting at a multiple of it."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    if body.get("participant") != owner:
        raise ValueError(f"alerts of {str(body.get('participant'))[:80]!r} on {owner}'s broker")
    start, end = body.get("window_start"), body.get("window_end")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (start, end)) or not 0 < end - start <= MAX_WINDOW_S:
        raise ValueError("window_start and window_end must be whole seconds, the window at most a day long")
    if window_s is not None and (end - start != window_s or start % window_s):
        raise ValueError(f"the window [{start}, {end}) is not one of {window_s} s windows")
    sources = body.get("sources")
    if not isinstance(sources, list) or len(sources) > MAX_SOURCES:
        raise ValueError(f"sources must be a list of at most {MAX_SOURCES} addresses")
    try:
        addresses = frozenset(ipaddress.ip_address(s).compressed for s in sources if isinstance(s, str))
    except ValueError as exc:
        raise ValueError(f"a source is not an IP address: {exc}") from None
    if len(addresses) != len(sources) or not all(isinstance(s, str) for s in sources):
        raise ValueError("sources must be distinct IP addresses")
    final = body.get("final", True)
    if not isinstance(final, bool):
        raise ValueError("final must be true or false")
    return Alerts(owner, (start, end), addresses, at, final)


async def follow(owner: str, endpoint: Endpoint, events: asyncio.Queue, stop: asyncio.Event, *, poll_s: float = 0.2,
                 timeout_s: float = 2.0, window_s: int | None = None, refused: Callable[[str, str], None] | None = None) -> None:
    """Put every message of `owner`'s `ALERTS` stream on `events`, in order, as `Alerts`, until `stop`.

    Reads by sequence number: a connection lost to a partition is made again, and reading
    resumes at the first message not read yet.
    """
    nc = None
    next_seq = 1
    while not stop.is_set():
        try:
            if nc is None:
                # pings every second: a link cut without a reset shows as a stale connection
                # within seconds, and the client connects again (not after TCP's back-off)
                nc = await connect(endpoint.url, endpoint.user, endpoint.password, endpoint.tls, reconnect_attempts=-1,
                                   connect_timeout=timeout_s, reconnect_time_wait=0.5, ping_interval=1, max_outstanding_pings=2)
            js = nc.jetstream(timeout=timeout_s)
            state = (await js.stream_info(ALERTS)).state
            next_seq = max(next_seq, state.first_seq)
            while next_seq <= state.last_seq and not stop.is_set():
                try:
                    msg = await js.get_msg(ALERTS, next_seq)
                except nats.js.errors.NotFoundError:
                    next_seq += 1  # removed by the stream's limits: nothing to read there
                    continue
                next_seq += 1
                try:
                    events.put_nowait(parse_alerts(msg.data, owner, time.time(), window_s))
                except ValueError as exc:
                    if refused is not None:
                        refused(owner, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # unreachable, refused or timed out: try again at the next poll
            log.debug("alerts of %s: %s: %s", owner, type(exc).__name__, exc)
            if nc is not None and nc.is_closed:
                nc = None
        try:
            await asyncio.wait_for(stop.wait(), poll_s)
        except TimeoutError:
            pass
    if nc is not None:
        await nc.close()


def publish_json(p: Publish) -> dict:
    return {"window_start": p.window[0], "window_end": p.window[1], "version": p.version, "stable": p.stable,
            "added": [r.to_json() for r in p.added], "retracted": [r.to_json() for r in p.retracted],
            "missing": list(p.missing), "due_at": p.due_at, "at": p.at}


def publish_from_json(body: Mapping) -> Publish:
    return Publish((int(body["window_start"]), int(body["window_end"])), int(body["version"]), bool(body["stable"]),
                   tuple(CorrelatedRow.from_json(r) for r in body["added"]), tuple(CorrelatedRow.from_json(r) for r in body["retracted"]),
                   tuple(body["missing"]), float(body["due_at"]), float(body["at"]))


class LiveCorrelator:
    """Participant `me`'s correlated result, run on a thread of its own until `close()`: it
    follows every source's alerts (`me`'s own among them), steps the DPC machine and
    publishes each version on `me`'s broker. `set_sources` changes whom it follows (a
    partner that signs or ends a contract): new windows then need exactly those.

    A restart goes on from the versions an earlier run published on `me`'s `CORRELATED`
    stream (`bpm.dpc.Correlator.resume`): it reads every source's alerts again, and publishes
    only the versions that follow.

    Attributes:
        published: versions published, tentative: of them tentative, refused: partner
            messages refused, last: when each source's alerts last arrived, resumed: versions
            of an earlier run it went on from.
    """

    def __init__(self, me: str, own: Endpoint, *, window_s: int | None = None, bound_s: float = 10.0, poll_s: float = 0.2) -> None:
        self.me = check_name(me, "participant name")
        self.own = own
        self.window_s = window_s
        self.bound_s = bound_s
        self.poll_s = poll_s
        self.machine = Correlator(frozenset({me}), bound_s=bound_s)
        self.published = self.tentative = self.refused = self.resumed = 0
        self.last: dict[str, float] = {}
        self._sources: dict[str, Endpoint] = {me: own}
        self._awaited: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._changed = True
        self._loop = asyncio.new_event_loop()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), name=f"correlate {me}", daemon=True)

    def start(self) -> LiveCorrelator:
        self._thread.start()
        return self

    def set_sources(self, partners: Mapping[str, Endpoint], awaited: Iterable[str] = ()) -> None:
        """Follow these partners (and `me`) from now on. New windows need their alerts and
        those of the partners `awaited`: partners that share theirs but cannot be read yet
        (unreachable, or not ready to answer), whose windows are published tentative after the
        bound until they are followed and their alerts arrive."""
        wanted = {self.me: self.own, **{p: ep for p, ep in partners.items() if p != self.me}}
        awaited = frozenset(awaited) - set(wanted)
        with self._lock:
            if (wanted, awaited) != (self._sources, self._awaited):
                self._sources, self._awaited, self._changed = wanted, awaited, True

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def status(self) -> dict:
        with self._lock:
            sources, awaited = sorted(self._sources), sorted(self._awaited)
        return {"sources": sources, "awaited": awaited, "bound_s": self.bound_s, "open_windows": len(self.machine.open), "stable_windows": len(self.machine.stable),
                "published": self.published, "tentative": self.tentative, "refused": self.refused, "resumed": self.resumed,
                "last_alerts": {p: round(t, 3) for p, t in self.last.items()}}

    async def _run(self) -> None:
        events: asyncio.Queue = asyncio.Queue()
        followers: dict[str, tuple[Endpoint, asyncio.Event, asyncio.Task]] = {}

        def refused(owner: str, why: str) -> None:
            self.refused += 1
            log.warning("refused alerts from %s: %s", owner, why)

        nc = await connect(self.own.url, self.own.user, self.own.password, self.own.tls, reconnect_attempts=-1)
        js = nc.jetstream(timeout=10.0)
        resumed = False
        try:
            while not self._stop.is_set():
                with self._lock:
                    sources, awaited, changed, self._changed = dict(self._sources), self._awaited, self._changed, False
                if changed:
                    for name in [n for n, (ep, _, _) in followers.items() if sources.get(n) != ep]:
                        followers.pop(name)[1].set()
                    for name, ep in sources.items():
                        if name not in followers:
                            stop = asyncio.Event()
                            followers[name] = (ep, stop, asyncio.create_task(follow(name, ep, events, stop, poll_s=self.poll_s, window_s=self.window_s,
                                                                                     refused=refused)))
                    await self._publish(js, self.machine.handle(Members(frozenset(sources) | awaited, time.time())))
                    if not resumed:
                        # Go on from what an earlier run published (none on a first start).
                        before = await correlated_versions(js)
                        self.machine.resume(before, time.time())
                        self.resumed, resumed = len(before), True
                due = self.machine.next_due()
                wait = self.poll_s if due is None else min(self.poll_s, max(0.0, due - time.time()))
                try:
                    event = await asyncio.wait_for(events.get(), wait)
                    self.last[event.participant] = event.at
                except TimeoutError:
                    event = Tick(time.time())
                await self._publish(js, self.machine.handle(event))
        finally:
            for _, stop, _ in followers.values():
                stop.set()
            await asyncio.gather(*(task for _, _, task in followers.values()), return_exceptions=True)
            await nc.close()

    async def _publish(self, js, instructions) -> None:
        for instruction in instructions:
            if isinstance(instruction, Ignored):
                log.info("ignored alerts of %s for %s: %s", instruction.participant, instruction.window, instruction.why)
                continue
            body = json.dumps(publish_json(instruction)).encode()
            await js.publish(f"corr.{instruction.window[0]}", body, stream=CORRELATED,
                             headers={"Nats-Msg-Id": f"{instruction.window[0]}.{instruction.version}"})
            self.published += 1
            self.tentative += not instruction.stable


_NATS_URL = re.compile(r"^nats://[A-Za-z0-9.:\[\]-]{1,253}:[0-9]{1,5}$")


def ask_alerts_credentials(endpoint: str, token: str, me: str, *, timeout_s: float = 10.0, verify: ssl.SSLContext | bool = True) -> Endpoint:
    """Where and as whom this participant, `me`, reads the alerts the partner at `endpoint`
    shares: asked with the registry's token for the call (purpose `alerts`). The answer is
    checked before use (a `nats://` address on the host of the partner's agent, the user
    `me`, a plain password); LookupError when the partner shares none, RuntimeError for
    anything else."""
    from spark_agents.broker.access import ask_agent

    body = ask_agent(endpoint, "/alerts/credentials", token, "its alerts", me, refusals={404: LookupError}, timeout_s=timeout_s, verify=verify)
    url = body.get("url")
    if not (isinstance(url, str) and _NATS_URL.match(url)):
        raise RuntimeError(f"{endpoint} answered with credentials that are not {me}'s on a NATS server")
    if urlsplit(url).hostname != urlsplit(endpoint).hostname:
        # where its agent is, as the registry lists it: a partner does not send me to connect elsewhere
        raise RuntimeError(f"{endpoint} points at a broker on another host ({url})")
    return Endpoint(url, body["user"], body["password"])


class Correlation:
    """A participant's duties in the correlated result, which its agent runs when it opts in
    (`bpm agent run --correlate`): share its alerts of every closed window on its own broker
    (`OwnAlerts`, `share_alerts`), and correlate them with those of its contract partners
    that share theirs (`LiveCorrelator`), asking each for its credentials (`ask`) once a
    contract is in force, again after `retry_s` when it refused or could not be reached.
    The correlation starts with the first partner that shares: a window correlated alone
    would be published stable without rows, before the partners' alerts could count.

    A partner that says it shares none (`LookupError`) is not waited for. One that could
    not be asked (unreachable, busy, not ready to answer) is *awaited*: windows wait for its
    alerts as for a partner cut off, tentative after the bound, rather than being published
    stable without the alerts it shares once it answers.

    Attributes:
        partners: the partners followed, with where their alerts are read.
        refused: per partner not followed, when it was last asked, why it gave nothing, and
            whether it said it shares none (else it is awaited).
        shared: windows of alerts shared so far.
    """

    def __init__(self, me: str, url: str, password: str, *, window_s: int, alert: Alert, bound_s: float = 10.0, retry_s: float = 30.0,
                 tls: str | None = None, lateness_s: int | None = None) -> None:
        from spark_agents.broker.source import JetStreamInput

        self.me = me
        self.retry_s = retry_s
        self.owner = Broker(url, me, password, tls=tls)
        ensure_streams(self.owner, correlated=True)
        shared = read_stream(self.owner, ALERTS, last=True)  # an agent restarted goes on after what it shared
        # With the tasks' lateness, what the participant's own input allows bounds what its tasks' hosts write.
        span = None if lateness_s is None else input_span(JetStreamInput(url, me, password, me, tls=tls), lateness_s, window_s)
        self.alerts = OwnAlerts(self.owner, window_s, alert, json.loads(shared[0])["window_end"] if shared else None, span)
        self.own = Endpoint(url, me, password, tls)
        self.bound_s = bound_s
        self.live: LiveCorrelator | None = None
        self.partners: dict[str, Endpoint] = {}
        self.refused: dict[str, tuple[float, str, bool]] = {}
        self.shared = 0

    @property
    def awaited(self) -> set[str]:
        """The partners not followed whose alerts the windows wait for."""
        return {p for p, (_, _, shares_none) in self.refused.items() if not shares_none}

    def step(self, tasks: Iterable[str], partners: Iterable[str], now: float, ask: Callable[[str], Endpoint]) -> None:
        """Share what closed since the last step; follow the partners in `partners` (contracts in force) and only them."""
        for window, sources in self.alerts.poll(tasks):
            share_alerts(self.owner, self.me, window, sources)
            self.shared += 1
        partners = set(partners) - {self.me}
        for partner in sorted(partners - set(self.partners)):
            if now - self.refused.get(partner, (-math.inf,))[0] < self.retry_s:
                continue
            try:
                self.partners[partner] = ask(partner)
                self.refused.pop(partner, None)
            except Exception as exc:  # it shares none, refuses, or cannot be reached: ask again later
                self.refused[partner] = (now, f"{type(exc).__name__}: {exc}", isinstance(exc, LookupError))
        for partner in set(self.partners) - partners:
            del self.partners[partner]
        for partner in set(self.refused) - partners:
            del self.refused[partner]
        if self.live is None and self.partners:
            self.live = LiveCorrelator(self.me, self.own, window_s=self.alerts.window_s, bound_s=self.bound_s)
            self.live.set_sources(self.partners, self.awaited)
            self.live.start()
        elif self.live is not None:
            self.live.set_sources(self.partners, self.awaited)

    def status(self) -> dict:
        live = self.live.status() if self.live is not None else {"sources": [self.me], "awaited": sorted(self.awaited), "bound_s": self.bound_s}
        return {**live, "shared_windows": self.shared, "refused": {p: why for p, (_, why, _) in sorted(self.refused.items())}}

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
        self.owner.close()


async def stream_messages(js, stream: str, *, last: bool = False) -> list[bytes]:
    """Every message of `stream` (through JetStream context `js`), in order (with `last`, the
    last one only); none when the stream does not exist."""
    try:
        state = (await js.stream_info(stream)).state
    except nats.js.errors.NotFoundError:
        return []
    out = []
    for seq in range(max(1, state.last_seq if last else state.first_seq), state.last_seq + 1):
        try:
            out.append((await js.get_msg(stream, seq)).data)
        except nats.js.errors.NotFoundError:
            continue
    return out


def read_stream(broker: Broker, stream: str, *, last: bool = False) -> list[bytes]:
    """Every message of `stream` on `broker`, in order (with `last`, the last one only)."""
    return broker.call(stream_messages(broker.js, stream, last=last))


async def correlated_versions(js) -> list[Publish]:
    """Every version published on this participant's `CORRELATED` stream (through JetStream context `js`), in order."""
    return [publish_from_json(json.loads(data)) for data in await stream_messages(js, CORRELATED)]


def read_correlated(broker: Broker) -> list[Publish]:
    """Every version published on this participant's `CORRELATED` stream, in order."""
    return broker.call(correlated_versions(broker.js))
