"""`bpm bench view-reads`: a participant's view read in a registry filled with history, each
statement measured in PostgreSQL, the database dropped after."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bpm_app.cli import app
from tests.conftest import require_postgres


def test_the_view_reads_a_participant_s_newest_movements_and_its_failovers_each_statement_measured_in_a_database_dropped_after():
    from sqlalchemy import create_engine, text

    server = require_postgres()
    out = CliRunner().invoke(app, ["bench", "view-reads", "--server", server, "--participants", "20", "--movements", "500",
                                   "--failovers", "100", "--repeat", "2", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Each participant moved each of its 5 tasks 5 times and took each of its neighbour's 5 times
    # (50 movements it sees, the last of each side active): the view has the newest of each of
    # those 10 tasks, ended or not. Of the 100 failovers (all complete), it sees the 5 of its
    # second task and the 5 in which it failed: the view has the newest of each of the 2 tasks.
    assert (result["view_movements"], result["view_tasks"], result["view_failovers"]) == (10, 5, 2), result
    movements = [r for r in result["reads"] if "FROM movements" in r["statement"] or r["statement"].startswith("SELECT movements.")]
    assert len(movements) == 1 and movements[0]["rows"] == 10 and movements[0]["plan"], result["reads"]
    assert all(r["median_ms"] >= 0 and r["plan"] for r in result["reads"])
    engine = create_engine(server)
    with engine.connect() as connection:
        left = connection.execute(text("SELECT count(*) FROM pg_database WHERE datname LIKE 'bpm_bench_reads_%'")).scalar()
    engine.dispose()
    assert left == 0, "the bench's database is dropped"


def test_a_database_that_is_not_postgresql_is_refused():
    out = CliRunner().invoke(app, ["bench", "view-reads", "--server", "sqlite:///x.db"], env={"COLUMNS": "200"})
    assert out.exit_code == 2 and "give a postgresql URL" in " ".join(out.output.split()), out.output
