"""Which key an agent starts with: given, kept from an earlier run, or obtained by registering;
a given key that the registry refuses gives way to a kept one that it accepts (rotated since)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bpm_http.client import RegistryClient
from spark_agents.agent import KEY_FILE, write_key
from spark_agents.runtime import participant_key
from tests.api.ui.federation import SteppedClock, in_process_registry


@pytest.fixture
def registry(tmp_path):
    with in_process_registry(tmp_path, SteppedClock(datetime(2026, 1, 1, tzinfo=UTC))) as running:
        yield running


def test_registering_keeping_and_preferring_a_rotated_key(registry, tmp_path):
    work = tmp_path / "north"
    work.mkdir()
    first = participant_key(registry.url, "north", "http://127.0.0.9:9000", work, None, registry.admin_key)
    assert (work / KEY_FILE).read_text().strip() == first, "registered, and kept"
    assert participant_key(registry.url, "north", "http://127.0.0.9:9000", work, None, None) == first, "kept from the earlier run"
    # The agent rotates its key while running and keeps the new one; its configuration still gives the first.
    with RegistryClient(registry.url, first) as client:
        rotated = client.rotate_key("north")["api_key"]
    write_key(work / KEY_FILE, rotated)
    assert participant_key(registry.url, "north", "http://127.0.0.9:9000", work, first, None) == rotated
    # A key given that the registry accepts wins over what the folder keeps (the operator handed out a new one).
    with RegistryClient(registry.url, registry.admin_key) as operator:
        handed = operator.rotate_key("north")["api_key"]
    assert participant_key(registry.url, "north", "http://127.0.0.9:9000", work, handed, None) == handed
    # Neither accepted (or no registry to ask): the given key, as before.
    assert participant_key(registry.url, "north", "http://127.0.0.9:9000", work, "nonsense", None) == "nonsense"
    assert participant_key("http://127.0.0.1:9", "north", "http://127.0.0.9:9000", work, first, None) == first


def test_no_key_and_no_operator_key_is_a_clear_error(registry, tmp_path):
    with pytest.raises(SystemExit, match="has no key"):
        participant_key(registry.url, "south", "http://127.0.0.9:9000", tmp_path, None, None)
