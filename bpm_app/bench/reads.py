"""`bpm bench view-reads`: what an agent's read of its view (`GET /participants/{name}/view`)
costs the database as the registry's history grows.

A database of its own on a PostgreSQL server is filled with a federation's records (each
participant with its tasks and a contract with its neighbour on a ring), `movements`
movements among them, all ended but the last one per participant, and `failovers`
failovers; then one participant's view is read the way the registry reads it
(`api.routers.participants.participant_view`), every statement it sends is captured, and
each is run again under `EXPLAIN ANALYZE`: its execution time in the database and the
plan's nodes. A read whose time grows with the movements or failovers ever made reads a
table whole; one that stays flat reads through an index.
The database is dropped at the end.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

TASKS_PER_PARTICIPANT = 5


def _fill(connection, participants: int, movements: int, failovers: int) -> None:
    from sqlalchemy import text

    p = {"p": participants, "t": participants * TASKS_PER_PARTICIPANT, "m": movements, "f": failovers, "k": TASKS_PER_PARTICIPANT}
    connection.execute(text("INSERT INTO participants (id, name, endpoint, key_hash, created_at) "
                            "SELECT i, 'p' || i, 'https://p' || i, md5(i::text) || md5('k' || i), now() FROM generate_series(1, :p) i"), p)
    connection.execute(text("INSERT INTO contracts (id, proposer_id, counterparty_id, last_proposed_by_id, pair_lo, pair_hi, price_min, price_max, "
                            "min_duration_s, ha_mode, state, created_at, updated_at) "
                            "SELECT i, i, i % :p + 1, i, least(i, i % :p + 1), greatest(i, i % :p + 1), 0.5, 1, 60, 'none', 'active', now(), now() "
                            "FROM generate_series(1, :p) i"), p)
    connection.execute(text("INSERT INTO tasks (id, name, origin_id, host_id, load, params, ha_mode, epoch, created_at) "
                            "SELECT i, 't' || i, (i - 1) / :k + 1, (i - 1) / :k + 1, 0.1, '{}', 'none', 0, now() FROM generate_series(1, :t) i"), p)
    # Movement i: participant (i - 1) % P + 1 moved one of its tasks, each in turn, to its
    # neighbour under offer i; the last one of each participant is still active.
    connection.execute(text("INSERT INTO offers (id, contract_id, from_id, to_id, task_ids, price, caps, state, created_at, expires_at) "
                            "SELECT i, (i - 1) % :p + 1, (i - 1) % :p + 1, i % :p + 1, '[]', 1, '[]', 'accepted', now(), now() "
                            "FROM generate_series(1, :m) i"), p)
    connection.execute(text("INSERT INTO movements (id, offer_id, contract_id, task_id, from_id, to_id, price, load, amount, accrued_at, state, "
                            "started_at, earliest_end_at) "
                            "SELECT i, i, (i - 1) % :p + 1, ((i - 1) % :p) * :k + ((i - 1) / :p) % :k + 1, (i - 1) % :p + 1, i % :p + 1, 1, 0.1, 0, now(), "
                            "CASE WHEN i > :m - :p THEN 'active' ELSE 'ended' END, now(), now() FROM generate_series(1, :m) i"), p)
    # Failover i: participant (i - 1) % P + 1's neighbour failed while it hosted the former's
    # second task, which went back to its origin.
    connection.execute(text("INSERT INTO failovers (id, task_id, kind, mode, failed_id, from_host_id, to_host_id, from_epoch, to_epoch, "
                            "detected_at, started_at, completed_at, recovery_s, details) "
                            "SELECT i, ((i - 1) % :p) * :k + 2, 'failover', 'passive_standby', i % :p + 1, i % :p + 1, (i - 1) % :p + 1, "
                            "1, 2, now(), now(), now(), 1.0, '{}' FROM generate_series(1, :f) i"), p)
    connection.execute(text("ANALYZE"))


def _plan_nodes(plan: dict) -> list[str]:
    """The plan's node types, depth first, with the table each scan reads."""
    node = plan["Node Type"] + (f" on {plan['Relation Name']}" if "Relation Name" in plan else "")
    return [node] + [n for child in plan.get("Plans", []) for n in _plan_nodes(child)]


def bench_view_reads(server_url: str, participants: int, movements: int, failovers: int = 0, repeat: int = 20,
                     on_step: Callable[[str], None] = lambda _: None) -> dict:
    """Fill a new database on the server at `server_url` (any database of it: the command
    connects there to create its own), read a participant's view, and measure each statement."""
    from sqlalchemy import create_engine, event, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from api.auth import Principal
    from api.migrate import upgrade
    from api.models import Participant
    from api.routers.participants import participant_view

    url = make_url(server_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"{url.render_as_string(hide_password=True)}: view-reads measures PostgreSQL's plans; give a postgresql URL")
    name = f"bpm_bench_reads_{secrets.token_hex(4)}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    database = url.set(database=name)
    try:
        on_step("migrating")
        upgrade(database.render_as_string(hide_password=False))
        engine = create_engine(database)
        on_step(f"filling: {participants} participants, {movements} movements, {failovers} failovers")
        with engine.begin() as connection:
            _fill(connection, participants, movements, failovers)
        me = participants // 2
        sent: list[tuple[str, object]] = []

        def capture(conn, cursor, statement, params, context, many) -> None:
            sent.append((statement, params))

        event.listen(engine, "before_cursor_execute", capture)
        view_ms = []
        on_step("reading the view")
        for _ in range(repeat):
            sent.clear()
            with Session(engine) as session:
                caller = Principal(session.get(Participant, me))
                started = time.perf_counter()
                view = participant_view(f"p{me}", session, caller, datetime.now(timezone.utc))
                view_ms.append((time.perf_counter() - started) * 1000)
        event.remove(engine, "before_cursor_execute", capture)
        statements = [(s, p) for s, p in sent if s.lstrip().upper().startswith(("SELECT", "WITH"))]
        reads = []
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            for statement, params in statements:
                times, plan, rows = [], None, None
                for _ in range(repeat):
                    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
                    plan = cursor.fetchone()[0][0]
                    times.append(plan["Execution Time"])
                    rows = plan["Plan"].get("Actual Rows")
                reads.append({"statement": " ".join(statement.split())[:120], "rows": rows,
                              "median_ms": round(statistics.median(times), 3), "plan": _plan_nodes(plan["Plan"])})
        finally:
            raw.close()
        engine.dispose()
        return {"benchmark": "view-reads", "participants": participants, "tasks": participants * TASKS_PER_PARTICIPANT,
                "movements": movements, "failovers": failovers, "participant": f"p{me}", "view_movements": len(view.movements),
                "view_tasks": len(view.tasks), "view_failovers": len(view.failovers),
                "view_ms_median": round(statistics.median(view_ms), 2), "database_ms_median": round(sum(r["median_ms"] for r in reads), 3),
                "reads": reads}
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
