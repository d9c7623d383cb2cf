"""`scripts/demo-with.py`: the demo's knobs set from NAME=VALUE arguments (no demo runs)."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "demo-with.py"


@pytest.fixture(scope="module")
def demo_with():
    spec = importlib.util.spec_from_file_location("demo_with", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_numeric_knobs_take_their_field_type(demo_with):
    assert demo_with.overrides(["fill=1.0", "min_duration_s=150", "sources=90"]) == {"fill": 1.0, "min_duration_s": 150.0, "sources": 90}
    assert isinstance(demo_with.overrides(["sources=90"])["sources"], int)


@pytest.mark.parametrize("argument, says", [("bogus=1", "bogus"), ("fill", "NAME=VALUE"), ("workdir=/tmp", "workdir"),
                                            ("fill=much", "not a number"), ("sources=1.5", "not a number"),
                                            ("phase_timeout_s=100", "--phase-timeout"), ("cpus=0.5", "--cpus")])
def test_anything_else_is_refused_with_a_message(demo_with, argument, says):
    with pytest.raises(SystemExit, match=says):
        demo_with.overrides([argument])


def test_without_the_separator_it_prints_its_usage(demo_with):
    with pytest.raises(SystemExit, match="usage"):
        demo_with.main(["fill=1.0"])
