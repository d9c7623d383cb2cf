"""The screenshot tool keeps working: it plays the scenario and saves every view."""

from __future__ import annotations

import struct

import pytest

from tests.api.ui.browser import VIEWPORT
from tests.api.ui.screenshots import SHOTS, capture

pytestmark = pytest.mark.slow


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.full
def test_capture_saves_every_view_at_laptop_size(tmp_path, browser):
    saved = capture(tmp_path, browser)
    assert sorted(p.name for p in saved) == sorted(["ui-signin.png", *(name for name, *_ in SHOTS)])
    for path in saved:
        assert png_size(path.read_bytes()) == (VIEWPORT["width"], VIEWPORT["height"])
