"""What a hostile partner sends an agent never becomes a path outside its work folder, a
full disk, or a server error."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
from fastapi.testclient import TestClient

from bpm.costs import MM1Cost
from bpm.names import UnsafeName, inside, task_key
from spark_agents import handover
from spark_agents.ha.delta import MANIFEST, DeltaRefused, apply_delta
from spark_agents.server import create_agent_app
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import SteppedHost


@pytest.mark.parametrize("name", ["t/../../../../tmp/evil", "..", ".", "", "a/b", "-x", "\x00"])
def test_a_task_key_from_a_hostile_name_is_refused(name):
    with pytest.raises(UnsafeName):
        task_key({"origin": "a", "name": name})
    with pytest.raises(UnsafeName):
        task_key({"origin": name, "name": "t"})


def test_task_keys_split_one_way_only():
    assert task_key({"origin": "acme", "name": "eu.p0"}) == "acme.eu.p0"
    with pytest.raises(UnsafeName, match="participant name"):
        task_key({"origin": "acme.eu", "name": "p0"})


def test_paths_are_resolved_inside_the_work_folder(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    assert inside(root, "a.t") == (root / "a.t").resolve()
    (root / "link").symlink_to(tmp_path)  # planted by anything: still refused once resolved
    with pytest.raises(UnsafeName):
        inside(root, "link")
    with pytest.raises(UnsafeName):
        inside(root, "../outside")


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def _file(name: str, data: bytes = b"x", size: int | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    return info, data


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info, b""


def test_a_checkpoint_archive_cannot_write_outside_its_folder(tmp_path):
    checkpoint = tmp_path / "work" / "checkpoints" / "a.t"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    for members in ([_file("../../../victim/keep", b"evil")], [_link("offsets", str(victim))], [_link("up", "../../..")]):
        with pytest.raises(handover.ArchiveRefused):
            handover.unpack(_archive(members), checkpoint, 1)
    assert (victim / "keep").read_text() == "mine"
    assert not checkpoint.exists()
    handover.unpack(_archive([_file("/abs", b"data")]), checkpoint, 1)  # an absolute name lands inside
    assert (checkpoint / "abs").read_bytes() == b"data"


def test_a_checkpoint_archive_over_the_caps_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(handover, "MAX_ARCHIVE_FILES", 3)
    with pytest.raises(handover.ArchiveRefused, match="members"):
        handover.unpack(_archive([_file(f"f{k}") for k in range(4)]), tmp_path / "ck", 1)
    monkeypatch.setattr(handover, "MAX_ARCHIVE_TOTAL", 10)
    with pytest.raises(handover.ArchiveRefused, match="unpacks to"):
        handover.unpack(_archive([_file("a", b"x" * 6), _file("b", b"x" * 6)]), tmp_path / "ck", 1)
    with pytest.raises(handover.ArchiveRefused, match="not a tar.gz"):
        handover.unpack(b"not an archive", tmp_path / "ck", 1)


def test_a_delta_with_a_bad_manifest_or_member_is_refused(tmp_path):
    backup = tmp_path / "backups" / "a.t"
    manifest = json.dumps({"seq": 1, "committed": 0, "position": 0, "files": ["offsets/0"]}).encode()
    for members in (
        [_file(MANIFEST, b"[1, 2]")],
        [_file(MANIFEST, b"not json")],
        [_file("offsets/0")],
        [_file(MANIFEST, manifest), _file("../../escape")],
        [_file(MANIFEST, manifest), _link("offsets/0", "/etc/passwd")],
    ):
        with pytest.raises(DeltaRefused):
            apply_delta(_archive(members), backup)
    assert not (tmp_path / "escape").exists()


@pytest.fixture
def agent_http(tmp_path):
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0))) as (_operator, _agents, add, _clock):
        agent = add("a", 1)
        with TestClient(create_agent_app(agent), raise_server_exceptions=False) as http:
            yield http, tmp_path


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/handover/..%2F..%2Fvictim?epoch=1"),
        ("GET", "/handover/a.p0?epoch=99999999999999999999"),
        ("POST", "/ha/.hidden/delta?epoch=1"),
    ],
)
def test_the_agent_refuses_unsafe_names_in_urls(agent_http, method, path):
    http, _ = agent_http
    response = http.request(method, path)
    assert response.status_code in (404, 422), response.text
    assert response.headers["content-type"].startswith("application/json")


def test_the_agent_caps_request_bodies(agent_http):
    http, _ = agent_http
    response = http.post("/tasks", content=b"{" + b" " * (2 << 20) + b"}", headers={"Content-Type": "application/json"})
    assert response.status_code == 413, response.text
    assert response.json()["detail"]


def test_a_new_task_with_a_path_for_a_name_is_refused(agent_http):
    http, tmp_path = agent_http
    response = http.post("/tasks", json={"name": "../../evil", "input_uri": "nats://127.0.0.1:4222/a"})
    assert response.status_code == 422, response.text
    assert not any(p.name == "evil" for p in tmp_path.rglob("*"))
    assert not os.path.exists(tmp_path.parent / "evil")
