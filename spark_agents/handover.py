"""Moving a task's checkpoint between agents: packed at the releasing host, fetched by the new one.

The new host pulls (`GET {previous}/handover/{task}?epoch=E`, with the registry's token for
this handover, `bpm.tokens`, naming it as the caller); the previous host answers only once
the registry says the task now belongs to the caller at epoch E
(fencing: a stale or foreign request gets 409), after stopping the task at a batch
boundary. The checkpoint travels as a tar.gz of the files a restart reads
(`spark_agents.checkpoint.restart_files`) and replaces the receiver's copy atomically
(extracted beside it, then renamed).
"""

from __future__ import annotations

import io
import shutil
import ssl
import tarfile
import time
from pathlib import Path

import httpx

from spark_agents.checkpoint import restart_files
from spark_agents.races import Refused

EPOCH_FILE = ".bpm-epoch"


class HandoverNotReady(Exception):
    """The previous host has not released the task yet (or the registry has not caught up)."""


class ArchiveRefused(ValueError):
    """A checkpoint archive from another participant that this agent will not unpack."""


# What one checkpoint archive (a handover or an HA delta) may unpack to: a task's state
# store is small (megabytes in the demo); these bounds only stop a hostile sender filling the disk.
MAX_ARCHIVE_FILES = 20_000
MAX_ARCHIVE_FILE = 256 << 20
MAX_ARCHIVE_TOTAL = 1 << 30
MAX_ARCHIVE_BYTES = 256 << 20  # the compressed archive, as a request or response body


def open_archive(data: bytes) -> tarfile.TarFile:
    """The tar.gz `data`, after checking its members' count and declared sizes (which bound
    what extracting writes) and that every member is a plain file or folder."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ArchiveRefused(f"archive of {len(data)} bytes is over {MAX_ARCHIVE_BYTES}")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")
        members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveRefused(f"not a tar.gz archive: {exc}") from exc
    if len(members) > MAX_ARCHIVE_FILES:
        raise ArchiveRefused(f"archive of {len(members)} members is over {MAX_ARCHIVE_FILES}")
    total = 0
    for member in members:
        if not (member.isfile() or member.isdir()):
            raise ArchiveRefused(f"archive member {member.name!r} is neither a file nor a folder")
        if member.size > MAX_ARCHIVE_FILE:
            raise ArchiveRefused(f"archive member {member.name!r} of {member.size} bytes is over {MAX_ARCHIVE_FILE}")
        total += member.size
    if total > MAX_ARCHIVE_TOTAL:
        raise ArchiveRefused(f"archive unpacks to {total} bytes, over {MAX_ARCHIVE_TOTAL}")
    return tar


PACK_ATTEMPTS = 5


def pack(checkpoint_dir: Path) -> bytes:
    """The checkpoint folder as tar.gz bytes (see `pack_counting`)."""
    return pack_counting(checkpoint_dir)[0]


def pack_counting(checkpoint_dir: Path, attempts: int = PACK_ATTEMPTS) -> tuple[bytes, int]:
    """The checkpoint as tar.gz bytes, and how many times packing had to start over.

    Spark's state-store maintenance, a background thread of the session, may still delete
    old versions from a stopped task's checkpoint, so a file can vanish between listing
    and reading it; packing again then gives a consistent copy.
    """
    for retries in range(attempts):
        try:
            return _pack_once(checkpoint_dir), retries
        except FileNotFoundError:
            if retries + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _pack_once(checkpoint_dir: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        if checkpoint_dir.exists():
            for relative in restart_files(checkpoint_dir):
                if relative.name != EPOCH_FILE:
                    tar.add(checkpoint_dir / relative, arcname=str(relative), recursive=False)
    return buffer.getvalue()


def unpack(data: bytes, checkpoint_dir: Path, epoch: int) -> None:
    staging = checkpoint_dir.with_name(checkpoint_dir.name + ".incoming")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with open_archive(data) as tar:
        try:
            tar.extractall(staging, filter="data")
        except tarfile.FilterError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ArchiveRefused(f"unsafe archive member: {exc}") from exc
    (staging / EPOCH_FILE).write_text(str(epoch))
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    staging.rename(checkpoint_dir)


def local_epoch(checkpoint_dir: Path) -> int | None:
    try:
        return int((checkpoint_dir / EPOCH_FILE).read_text())
    except (OSError, ValueError):
        return None


def mark_epoch(checkpoint_dir: Path, epoch: int) -> None:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (checkpoint_dir / EPOCH_FILE).write_text(str(epoch))


def _read_capped(response: httpx.Response) -> bytes:
    """The response body, refusing one over MAX_ARCHIVE_BYTES (the sender may be hostile)."""
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_ARCHIVE_BYTES:
            raise ArchiveRefused(f"checkpoint from {response.url.host} over {MAX_ARCHIVE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def fetch(endpoint: str, task_key: str, epoch: int, token: str, *, timeout_s: float = 60.0, poll_s: float = 0.1,
          verify: ssl.SSLContext | bool = True) -> bytes:
    """The checkpoint of `task_key` from its previous host, retrying while it is not released
    yet; `token` is the registry's grant of this call (`bpm.tokens`), `verify` what the
    previous host's TLS must show (`spark_agents.tls.Peers.verify`)."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with httpx.Client(base_url=endpoint.rstrip("/"), timeout=30.0, headers={"Authorization": f"Bearer {token}"}, verify=verify) as http:
        while time.monotonic() < deadline:
            try:
                with http.stream("GET", f"/handover/{task_key}", params={"epoch": epoch}) as response:
                    body = _read_capped(response)
            except httpx.HTTPError as exc:
                last = f"unreachable: {exc}"
            else:
                if response.status_code == 200:
                    return body
                last = f"{response.status_code}: {body[:200].decode(errors='replace')}"
                if response.status_code == 409:  # the registry, read by the previous host just now, places the task elsewhere
                    raise Refused(f"{endpoint} refuses the checkpoint of {task_key} at epoch {epoch}: {last}")
                if response.status_code not in (404, 503):
                    break
            time.sleep(poll_s)
    raise HandoverNotReady(f"checkpoint of {task_key} at epoch {epoch} not released by {endpoint}: {last}")
