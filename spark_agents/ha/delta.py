"""Delta checkpoints for passive standby: every interval, only the checkpoint files that are new
since the last copy travel to the backup, and the backup's copy is always one a task can restart from.

A copy is a *cut* at the task's newest committed batch C: the commit and offset logs up to
C, the state versions up to C + 1 (batch N writes version N + 1), and the files that belong
to no batch (`metadata`, state schemas). Files of a batch still running are left out, so
restarting from the copy is restarting a task that stopped right after batch C: Spark plans
batch C + 1 again, reading the stream after the sequence batch C read up to. Hadoop's `.crc` side files are left
out too (they only let Hadoop verify a read; a file without one is read unverified), as
are hidden temporary files and the receiver's epoch mark.

Ordering: the sender lists the commits before the other logs and the state, so every file
the newest listed commit needs already exists when it is listed (Spark writes state and
logs before the commit). The backup writes each file atomically and in the order Spark
does, state first, then the source log, the offsets, the commits last, so a copy
interrupted half way still restarts from its previous cut; then it deletes the files the
sender no longer has (old state versions and logs that Spark's maintenance removed).

Each delta carries a sequence number; the sender counts a file as copied only once the
backup confirmed the delta (`DeltaShipper.confirm`), so a lost delta is sent again within
the next one, and the backup refuses a delta older than the last it applied.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from spark_agents.checkpoint import processed_seq
from spark_agents.ha.logs import committed_batch
from spark_agents.handover import EPOCH_FILE, PACK_ATTEMPTS, ArchiveRefused, open_archive

MANIFEST = "_delta.json"
COPY_FILE = ".bpm-copy.json"
_STATE_FILE = re.compile(r"^(\d+)(?:_[^.]*)?\.(delta|snapshot|changelog|zip)$")
# The order in which the backup writes a delta's files: as Spark does, commits last.
_ORDER = {"other": 0, "state": 1, "offsets": 2, "commits": 3}


class DeltaRefused(RuntimeError):
    """The backup cannot apply this delta (older than what it holds, or the backup was promoted)."""


def _skipped(rel: Path) -> bool:
    name = rel.name
    if name in (EPOCH_FILE, COPY_FILE):
        return True
    return name.endswith(".crc") or name.startswith(".")


def _kind(rel: Path) -> str:
    top = rel.parts[0] if len(rel.parts) > 1 else ""
    return top if top in _ORDER else "other"


def _in_cut(rel: Path, committed: int) -> bool:
    kind = _kind(rel)
    if kind in ("commits", "offsets"):
        return rel.name.isdigit() and int(rel.name) <= committed
    if kind == "state":
        m = _STATE_FILE.match(rel.name)
        return m is None or int(m.group(1)) <= committed + 1
    return True


@dataclass(frozen=True)
class Cut:
    """The files of a restartable copy of a checkpoint, as (size, mtime in ns) per relative path.

    Attributes:
        committed: the newest committed batch (None: no batch committed yet).
        position: the stream sequence the committed batches read up to (None: none), after
            which a restart from the copy reads (the JetStream source's offset, `spark_agents.broker.source`).
        files: the files of the copy.
    """

    committed: int | None
    position: int | None
    files: dict[str, tuple[int, int]]


def _list(root: Path, folder: str) -> list[Path]:
    base = root / folder if folder else root
    if not base.exists():
        return []
    if folder:
        return [p for p in base.rglob("*") if p.is_file()]
    return [p for p in base.iterdir() if p.is_file()]


def checkpoint_cut(checkpoint_dir: str | Path) -> Cut:
    """The cut of a running task's checkpoint at its newest committed batch (see the module text)."""
    root = Path(checkpoint_dir)
    committed = committed_batch(root)  # listed first: everything it needs exists by now
    position = None if committed is None else processed_seq(root, committed)
    files: dict[str, tuple[int, int]] = {}
    for folder in ("commits", "offsets", "state", ""):
        for path in _list(root, folder):
            rel = path.relative_to(root)
            if _skipped(rel) or (committed is None and _kind(rel) != "other"):
                continue
            if committed is not None and not _in_cut(rel, committed):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # removed by Spark's maintenance since the listing
                continue
            files[str(rel)] = (st.st_size, st.st_mtime_ns)
    return Cut(committed, position, files)


@dataclass(frozen=True)
class Delta:
    """One packed delta, ready to send.

    Attributes:
        data: the tar.gz bytes (a manifest and the files new since the last confirmed copy).
        seq: its sequence number.
        committed: the batch the copy is cut at.
        position: the stream sequence that batch read up to.
        carried: files carried; total: files in the cut.
        cut: the files of the cut (what the sender counts as copied once confirmed).
    """

    data: bytes
    seq: int
    committed: int | None
    position: int | None
    carried: int
    total: int
    cut: dict[str, tuple[int, int]] = field(repr=False)

    @property
    def ack_position(self) -> int | None:
        """Where the backup's restart reads the stream from (None before any batch): what the host acknowledges."""
        return None if self.committed is None else self.position


class DeltaShipper:
    """The primary's side of passive standby for one task: packs deltas of its checkpoint.

    Attributes:
        checkpoint_dir: the running task's checkpoint.
        copied: the files the backup has confirmed, with the (size, mtime) it has of each.
        seq: the sequence number of the last packed delta.
        pack_retries: how often packing started over because Spark removed a file meanwhile.
    """

    def __init__(self, checkpoint_dir: str | Path, attempts: int = PACK_ATTEMPTS) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self.attempts = attempts
        self.copied: dict[str, tuple[int, int]] = {}
        self.seq = 0
        self.pack_retries = 0
        self._lock = threading.Lock()

    def pack(self) -> Delta:
        """The files of the current cut that the backup lacks, with the manifest of the whole cut."""
        with self._lock:
            for attempt in range(self.attempts):
                try:
                    return self._pack_once()
                except FileNotFoundError:
                    self.pack_retries += 1
                    if attempt + 1 == self.attempts:
                        raise
            raise AssertionError("unreachable")

    def _pack_once(self) -> Delta:
        cut = checkpoint_cut(self.checkpoint_dir)
        new = sorted((rel for rel, sig in cut.files.items() if self.copied.get(rel) != sig), key=lambda r: (_ORDER[_kind(Path(r))], r))
        seq = self.seq + 1
        manifest = {"seq": seq, "committed": cut.committed, "position": cut.position, "files": sorted(cut.files)}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
            body = json.dumps(manifest).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
            for rel in new:
                tar.add(self.checkpoint_dir / rel, arcname=rel, recursive=False)
        self.seq = seq
        return Delta(buffer.getvalue(), seq, cut.committed, cut.position, len(new), len(cut.files), cut.files)

    def confirm(self, delta: Delta) -> None:
        """The backup applied `delta`: its files count as copied from now on."""
        with self._lock:
            self.copied = dict(delta.cut)

    def reset(self) -> None:
        """Send everything again with the next delta (a new, empty backup: the repair of a lost one)."""
        with self._lock:
            self.copied = {}


@dataclass(frozen=True)
class Applied:
    """What a backup holds after applying a delta.

    Attributes:
        seq: the delta's sequence number.
        committed: the batch its copy is cut at.
        position: the stream sequence that batch read up to.
        written: files written; removed: files deleted (gone at the primary).
    """

    seq: int
    committed: int | None
    position: int | None
    written: int = field(default=0, compare=False)
    removed: int = field(default=0, compare=False)

    @property
    def ack_position(self) -> int | None:
        return None if self.committed is None else self.position


def _write_atomic(target: Path, data: bytes) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.incoming")
    temp.write_bytes(data)
    os.replace(temp, target)


def applied_copy(backup_dir: str | Path) -> Applied | None:
    """What the backup folder holds (None: no delta applied yet)."""
    try:
        data = json.loads((Path(backup_dir) / COPY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return Applied(data["seq"], data["committed"], data["position"])


def _manifest(tar: tarfile.TarFile, members: dict) -> dict:
    """The delta's manifest, checked for the fields and types applying it reads."""
    try:
        manifest = json.loads(tar.extractfile(members.pop(MANIFEST)).read())
        ok = (isinstance(manifest, dict) and isinstance(manifest.get("seq"), int) and isinstance(manifest.get("files"), list)
              and all(isinstance(f, str) for f in manifest["files"])
              and all(manifest.get(k) is None or isinstance(manifest[k], int) for k in ("committed", "position")))
    except (KeyError, ValueError, tarfile.TarError) as exc:
        raise DeltaRefused(f"a delta without a readable manifest: {exc}") from exc
    if not ok:
        raise DeltaRefused("a delta whose manifest lacks seq, files, committed or position")
    return manifest


def apply_delta(data: bytes, backup_dir: str | Path) -> Applied:
    """Apply a delta to the backup's copy (see the module text for the order); refuses an old one."""
    root = Path(backup_dir)
    try:
        tar = open_archive(data)
    except ArchiveRefused as exc:
        raise DeltaRefused(str(exc)) from exc
    with tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        manifest = _manifest(tar, members)
        current = applied_copy(root)
        if current is not None and manifest["seq"] <= current.seq:
            raise DeltaRefused(f"delta {manifest['seq']} is not newer than the copy's {current.seq}")
        wanted = set(manifest["files"])
        for name in sorted(members, key=lambda r: (_ORDER[_kind(Path(r))], r)):
            rel = Path(name)
            if rel.is_absolute() or ".." in rel.parts or name not in wanted:
                raise DeltaRefused(f"unexpected member {name!r} in a delta")
            _write_atomic(root / rel, tar.extractfile(members[name]).read())
    removed = 0
    if root.exists():
        for path in [p for p in root.rglob("*") if p.is_file()]:
            rel = path.relative_to(root)
            if not _skipped(rel) and str(rel) not in wanted:
                path.unlink(missing_ok=True)
                removed += 1
    applied = Applied(manifest["seq"], manifest["committed"], manifest["position"], len(members), removed)
    _write_atomic(root / COPY_FILE, json.dumps({"seq": applied.seq, "committed": applied.committed, "position": applied.position}).encode())
    return applied
