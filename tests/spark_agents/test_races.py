"""A step that lost a race is counted, read again and recorded; anything else is an error (`spark_agents.races`)."""

import pytest

from bpm_http.client import RegistryError
from spark_agents.races import Races, Refused, lost_race


def _races():
    notes, reread = [], set()
    return Races(lambda kind, message: notes.append((kind, message)), reread.update), notes, reread


@pytest.mark.parametrize("exc", [RegistryError(409, "offer #3 is already accepted"), Refused("b refuses the checkpoint")])
def test_a_refusal_by_the_registry_or_a_partner_is_a_lost_race(exc):
    races, notes, reread = _races()
    with races.lost("offer of tasks ['1'] to b") as lost:
        raise exc
    assert lost and lost.exc is exc
    assert races.count == 1 and reread == {"task", "offer"}
    assert notes == [("agent.race", f"offer of tasks ['1'] to b: {exc}; reading again")]


@pytest.mark.parametrize("exc", [RegistryError(422, "caps leave the contract's range"), RegistryError(500, "boom"), ValueError("bad"),
                                 PermissionError(13, "Permission denied", "/var/lib/bpm/a/checkpoints")])
def test_any_other_failure_passes_through_untouched(exc):
    races, notes, reread = _races()
    with pytest.raises(type(exc)):
        with races.lost("step"):
            raise exc
    assert (races.count, notes, reread) == (0, [], set())


def test_a_step_that_goes_through_is_not_lost_and_a_caller_may_read_more_statuses_as_races():
    races, notes, _ = _races()
    with races.lost("step") as lost:
        pass
    assert not lost and races.count == 0 and notes == []
    with races.lost("replica at c", kind="replica.refused", reread=("task",), also=(422,)) as lost:
        raise RegistryError(422, "the task moved")
    assert lost and notes[0][0] == "replica.refused" and races.count == 1
    assert lost_race(RegistryError(422, "x"), also=(422,)) and not lost_race(RegistryError(422, "x"))
