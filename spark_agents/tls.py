"""TLS between participants' agents: each serves its HTTP API with a certificate of its own,
registered with the registry (`bpm.certificates`), and trusts in a partner only the
certificate the registry lists for that partner.

`own_certificate` gives the pair an agent serves (the operator's files, else one it made and
keeps in its work folder); `Peers` knows where each partner's agent listens and makes the
connections to it: over HTTPS pinned to its registered certificate, or over plain HTTP only
when this agent runs `--insecure`.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from bpm import certificates
from spark_agents.credentials import write_private

log = logging.getLogger(__name__)

TLS_FOLDER = "tls"
RENEW_BEFORE = dt.timedelta(days=30)  # a kept certificate closer than this to its end is made anew
PEER_REFRESH_S = 30.0  # how long a partner's endpoint and certificate, as read, are used before being read again
PEER_TIMEOUT_S = 10.0


class PeerRefused(RuntimeError):
    """This agent will not talk to a partner's agent over this link (plain HTTP without
    `--insecure`, or HTTPS without a registered certificate)."""


@dataclass(frozen=True)
class OwnCertificate:
    cert_file: Path
    key_file: Path
    pem: str


def kept_certificate(workdir: Path) -> Path:
    """Where an agent with work folder `workdir` keeps the certificate it made (`own_certificate`)."""
    return workdir / TLS_FOLDER / "cert.pem"


def own_certificate(workdir: Path, name: str, hosts: list[str], *, cert_file: Path | None = None, key_file: Path | None = None,
                    now: dt.datetime | None = None) -> OwnCertificate:
    """The certificate and key this agent serves: the operator's (`cert_file`, `key_file`,
    both or neither), else the pair kept in `workdir/tls`, made anew when missing, naming
    other hosts than `hosts`, or within `RENEW_BEFORE` of its end. Raises ValueError for an
    operator's file that is not a usable certificate."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("a TLS certificate needs its key, and a key its certificate (--tls-cert and --tls-key)")
    if cert_file is not None and key_file is not None:
        try:
            pem = certificates.parse(cert_file.read_text(), now=now).pem
        except (OSError, certificates.CertificateError) as exc:
            raise ValueError(f"{cert_file}: {exc}") from None
        return OwnCertificate(cert_file, key_file, pem)
    cert_path = kept_certificate(workdir)
    key_path = cert_path.with_name("key.pem")
    now = now or dt.datetime.now(dt.UTC)
    if cert_path.exists() and key_path.exists():
        try:
            kept = certificates.parse(cert_path.read_text(), now=now)
            if kept.not_after - now > RENEW_BEFORE and set(hosts) <= certificates.hosts(kept.pem):
                return OwnCertificate(cert_path, key_path, kept.pem)
        except (OSError, certificates.CertificateError) as exc:
            log.warning("%s: the kept TLS certificate is not usable (%s): making a new one", name, exc)
    cert, key = certificates.self_signed(name, hosts, now=now)
    write_private(key_path, key.decode("ascii"))
    write_private(cert_path, cert.decode("ascii"))
    log.info("%s: made a TLS certificate for %s (%s...)", name, ", ".join(hosts), certificates.sha256(cert.decode())[:16])
    return OwnCertificate(cert_path, key_path, cert.decode())


@functools.lru_cache(maxsize=256)
def pinned_context(pem: str) -> ssl.SSLContext:
    """A client context that trusts `pem` and nothing else: the peer must show that very
    certificate (its names are not checked: no other certificate verifies at all)."""
    context = ssl.create_default_context(cadata=pem)
    context.check_hostname = False
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class Peers:
    """Where each partner's agent listens, as the registry says (`read(participant)` gives its
    record), and how this agent connects to it.

    Attributes:
        insecure: plain HTTP to a partner that registered an `http://` endpoint is allowed.
        transport: what the clients send through (None: the network; a test's mock).
    """

    def __init__(self, read: Callable[[str], Mapping], *, insecure: bool = False, clock: Callable[[], float] = time.monotonic,
                 refresh_s: float = PEER_REFRESH_S) -> None:
        self._read = read
        self.insecure = insecure
        self._transport: httpx.BaseTransport | None = None
        self._clock = clock
        self._refresh_s = refresh_s
        self._known: dict[str, tuple[str, str | None, float]] = {}  # participant -> (endpoint, certificate, read at)
        self._pins: dict[str, str | None] = {}  # endpoint -> certificate
        self._owners: dict[str, str] = {}  # endpoint -> the participant that registered it
        self._refreshing: set[str] = set()  # participants whose record is being read again
        self._clients: dict[tuple[str, str | None], httpx.Client] = {}
        self._lock = threading.Lock()

    def endpoint(self, participant: str) -> str:
        """`participant`'s agent's URL. Read from the registry the first time; after that the
        record is read again in the background once `refresh_s` old (a partner that
        registered a new certificate is trusted within that), and what was read before
        stands meanwhile, also while the registry cannot be read: partners still reach each
        other when the registry is cut off from them, and no call waits for it."""
        with self._lock:
            known = self._known.get(participant)
            stale = known is not None and self._clock() - known[2] >= self._refresh_s and participant not in self._refreshing
            if stale:
                self._refreshing.add(participant)
        if known is None:
            return self._learn(participant)
        if stale:
            threading.Thread(target=self._refresh, args=(participant,), name=f"bpm-peer-{participant}", daemon=True).start()
        return known[0]

    def _learn(self, participant: str) -> str:
        record = self._read(participant)
        endpoint, certificate = str(record["endpoint"]), record.get("certificate")
        with self._lock:
            # A certificate is pinned by endpoint: one that another participant registered
            # too (say a hostile one, with its own certificate) is no one's.
            owner = self._owners.setdefault(endpoint, participant)
            if owner != participant:
                raise PeerRefused(f"{participant} and {owner} both register {endpoint}: neither is trusted there")
            if certificate is not None or urlsplit(endpoint).scheme != "https":  # an agent about to register its own is read again
                self._known[participant] = (endpoint, certificate, self._clock())
            self._pins[endpoint] = certificate
        return endpoint

    def _refresh(self, participant: str) -> None:
        try:
            self._learn(participant)
        except Exception as exc:  # the registry unreachable: the record read before stands until the next try
            log.debug("cannot read %s's record again: %s", participant, exc)
            with self._lock:
                endpoint, certificate, _ = self._known[participant]
                self._known[participant] = (endpoint, certificate, self._clock())
        finally:
            with self._lock:
                self._refreshing.discard(participant)

    @property
    def transport(self) -> httpx.BaseTransport | None:
        return self._transport

    @transport.setter
    def transport(self, transport: httpx.BaseTransport | None) -> None:
        self.close()  # clients made before send the old way
        self._transport = transport

    def verify(self, endpoint: str) -> ssl.SSLContext | bool:
        """What httpx checks of `endpoint`'s peer (its `verify`): the registered certificate
        of the participant there. Raises `PeerRefused` for a link this agent will not use."""
        scheme = urlsplit(endpoint).scheme
        if scheme == "https":
            with self._lock:
                pem = self._pins.get(endpoint)
            if pem is None:
                raise PeerRefused(f"{endpoint} has registered no TLS certificate: nothing to check its agent against")
            return pinned_context(pem)
        if scheme == "http" and self.insecure:
            return True  # not used: no TLS
        raise PeerRefused(f"{endpoint} is not HTTPS: plain text to a partner only with --insecure")

    def broker_tls(self, participant: str) -> str | None:
        """The certificate `participant`'s broker shows, which this agent pins: the one its
        agent registered (a participant's broker serves its agent's certificate); None when
        its agent speaks plain text (an `http://` endpoint, used with `--insecure` only).
        Raises `PeerRefused` as `verify` does."""
        endpoint = self.endpoint(participant)
        self.verify(endpoint)
        if urlsplit(endpoint).scheme != "https":
            return None
        with self._lock:
            return self._pins.get(endpoint)

    def client(self, endpoint: str) -> httpx.Client:
        """An HTTP client for `endpoint`'s agent (kept while its certificate stays the same)."""
        verify = self.verify(endpoint)
        with self._lock:
            pem = self._pins.get(endpoint)
            client = self._clients.get((endpoint, pem))
            if client is None:
                for old in [k for k in self._clients if k[0] == endpoint]:  # its certificate before
                    self._clients.pop(old).close()
                client = self._clients[(endpoint, pem)] = httpx.Client(timeout=PEER_TIMEOUT_S, verify=verify, transport=self._transport)
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
