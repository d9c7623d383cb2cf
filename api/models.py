"""The registry's tables: participants, contracts, tasks, offers, movements, events, load samples,
the change feed, and for high availability replicas and failovers."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from api.db import Base, UTCDateTime, utcnow


class Participant(Base):
    """A member of the federation; the last heartbeat's load report is kept on the row."""

    __tablename__ = "participants"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    endpoint: Mapped[str] = mapped_column(String(512))
    # The TLS certificate its agent serves (PEM), which partners pin (`bpm.certificates`).
    certificate: Mapped[str | None] = mapped_column(Text, nullable=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    load: Mapped[float | None] = mapped_column(Float, nullable=True)
    threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    marginal_cost: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # The last heartbeat's full report, kept for the operator and written only: deferred, so
    # that loading a participant (every authenticated request) does not parse it.
    report: Mapped[dict | None] = mapped_column(JSON, nullable=True, deferred=True)


class Contract(Base):
    """A bilateral bounded-price contract; `pair_lo`/`pair_hi` order the two parties' ids."""

    __tablename__ = "contracts"
    __table_args__ = (
        # At most one active contract per pair, enforced by the database under races too.
        Index(
            "uq_contracts_active_pair",
            "pair_lo",
            "pair_hi",
            unique=True,
            sqlite_where=text("state = 'active'"),
            postgresql_where=text("state = 'active'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    # Indexed: a heartbeat reads its participant's partners by them.
    proposer_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    counterparty_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    last_proposed_by_id: Mapped[int] = mapped_column(ForeignKey("participants.id"))
    pair_lo: Mapped[int] = mapped_column(Integer)
    pair_hi: Mapped[int] = mapped_column(Integer)
    price_min: Mapped[float] = mapped_column(Float)
    price_max: Mapped[float] = mapped_column(Float)
    min_duration_s: Mapped[float] = mapped_column(Float)
    valid_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ha_mode: Mapped[str] = mapped_column(String(32), default="none")
    state: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    proposer: Mapped[Participant] = relationship(foreign_keys=[proposer_id], lazy="joined")
    counterparty: Mapped[Participant] = relationship(foreign_keys=[counterparty_id], lazy="joined")
    last_proposed_by: Mapped[Participant] = relationship(foreign_keys=[last_proposed_by_id], lazy="joined")


class Task(Base):
    """A movable unit of load; `epoch` grows at every change of host (fencing for HA)."""

    __tablename__ = "tasks"
    __table_args__ = (UniqueConstraint("origin_id", "name", name="uq_tasks_origin_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    origin_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    host_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    load: Mapped[float] = mapped_column(Float, default=0.0)
    input_uri: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    params: Mapped[dict] = mapped_column(JSON, default=dict)
    # The query it runs (`bpm.query`) and the digest of its definition: a host refuses a task
    # whose query it does not have in that version.
    query: Mapped[str | None] = mapped_column(String(64), nullable=True)
    query_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ha_mode: Mapped[str] = mapped_column(String(32), default="none")
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Its span of event time, epoch seconds at window starts (`bpm.negotiation.granularity`):
    # a task a split or merge made starts at `since_s`; one that handed its key groups over
    # ends at `until_s`, and once its last window is out its origin retires it.
    since_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    until_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    origin: Mapped[Participant] = relationship(foreign_keys=[origin_id], lazy="joined")
    host: Mapped[Participant] = relationship(foreign_keys=[host_id], lazy="joined")
    lineage: Mapped[list[TaskLineage]] = relationship(foreign_keys="TaskLineage.child_id", order_by="TaskLineage.parent_id")


class TaskLineage(Base):
    """Task `child_id` came from task `parent_id` by a split (one parent, whose key groups
    `groups` halve) or a merge (two parents, halves of `groups`). A task hands each share of
    its key groups over once: the database refuses a second child with the same groups."""

    __tablename__ = "task_lineage"
    __table_args__ = (UniqueConstraint("parent_id", "groups", name="uq_task_lineage_parent_groups"),)

    child_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), primary_key=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), primary_key=True, index=True)
    groups: Mapped[str] = mapped_column(String(8))


class Offer(Base):
    """A proposal to move tasks from `from_id` to `to_id` under a contract at up to one price.

    Attributes:
        price: the offerer's cap, the most it pays per unit of load for the whole set.
        caps: for each k, the offerer's cap for the first k tasks (not increasing; the
            last is `price`).
        loads: each task's load as the offerer declared it when it priced the offer; what a
            movement of the task accrues is bounded by it (`api.services.offers.billed_load`).
        settled_price: once accepted, the price the movements run at (within the
            contract's range and at most the cap for as many tasks as were taken).
    """

    __tablename__ = "offers"
    __table_args__ = (
        # One pending offer per participant, enforced by the database under races too; an
        # offer past its expiry is stored as 'expired' before its maker offers again.
        Index(
            "uq_offers_one_pending",
            "from_id",
            unique=True,
            sqlite_where=text("state = 'pending'"),
            postgresql_where=text("state = 'pending'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    contract_id: Mapped[int] = mapped_column(ForeignKey("contracts.id"), index=True)
    from_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    to_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    task_ids: Mapped[list] = mapped_column(JSON)
    accepted_task_ids: Mapped[list | None] = mapped_column(JSON, nullable=True)
    price: Mapped[float] = mapped_column(Float)
    caps: Mapped[list] = mapped_column(JSON)
    loads: Mapped[list | None] = mapped_column(JSON, nullable=True)
    settled_price: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)

    from_participant: Mapped[Participant] = relationship(foreign_keys=[from_id], lazy="joined")
    to_participant: Mapped[Participant] = relationship(foreign_keys=[to_id], lazy="joined")


class Movement(Base):
    """One task hosted away from its origin under an accepted offer; accrues payment while active."""

    __tablename__ = "movements"

    id: Mapped[int] = mapped_column(primary_key=True)
    offer_id: Mapped[int] = mapped_column(ForeignKey("offers.id"), index=True)
    contract_id: Mapped[int] = mapped_column(ForeignKey("contracts.id"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    from_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    to_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    price: Mapped[float] = mapped_column(Float)
    # The load the movement is paid on: its host's last measurement, bounded by what the offer
    # declared (as declared, until the host reports); `amount` is what accrued up to
    # `accrued_at`, each interval at the load billed over it.
    load: Mapped[float] = mapped_column(Float)
    # The task's load as the offer declared it: the host is paid on at most `BILLED_LOAD_SLACK`
    # times it, however much it reports (None on rows from before offers declared loads).
    declared_load: Mapped[float | None] = mapped_column(Float, nullable=True)
    amount: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    accrued_at: Mapped[datetime] = mapped_column(UTCDateTime)
    state: Mapped[str] = mapped_column(String(16), index=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    earliest_end_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    ended_by_id: Mapped[int | None] = mapped_column(ForeignKey("participants.id"), nullable=True)

    task: Mapped[Task] = relationship(lazy="joined")
    from_participant: Mapped[Participant] = relationship(foreign_keys=[from_id], lazy="joined")
    to_participant: Mapped[Participant] = relationship(foreign_keys=[to_id], lazy="joined")


class Event(Base):
    """A readable record of something that happened: offers, refusals, movements, errors."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)
    actor: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    subject: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict] = mapped_column(JSON, default=dict)


class Change(Base):
    """One participant's notice that something concerning it changed (`api.services.changes`):
    `kind` says what to read again (task, offer, contract or keys). Its agent acknowledges the
    notices it has acted on, which deletes them."""

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_participant_id_id", "participant_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id"))
    kind: Mapped[str] = mapped_column(String(16))


class LoadSample(Base):
    """A participant's load and threshold at one heartbeat, for the load-over-time chart."""

    __tablename__ = "load_samples"

    id: Mapped[int] = mapped_column(primary_key=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    load: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float | None] = mapped_column(Float, nullable=True)


class Replica(Base):
    """A standby copy of a task kept at a second participant (`participant_id`, the holder).

    `role` is active_standby (a replica task runs on the same input) or passive_standby
    (checkpoint copies). `state`: active, promoted (its holder took the task over),
    failed (its holder failed), dropped. `epoch` is the task epoch it replicates: a copy
    from an older epoch comes from a fenced writer. `position` is the stream position of
    the last checkpoint copy (passive) or of the replica's last batch (active).
    """

    __tablename__ = "replicas"
    __table_args__ = (
        # One live record per (task, holder), enforced by the database under races too.
        Index(
            "uq_replicas_task_holder",
            "task_id",
            "participant_id",
            unique=True,
            sqlite_where=text("state != 'dropped'"),
            postgresql_where=text("state != 'dropped'"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    role: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    position: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    bytes_copied: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    task: Mapped[Task] = relationship(lazy="joined")
    participant: Mapped[Participant] = relationship(lazy="joined")


class Failover(Base):
    """A task taken over from a failed host (kind failover) or a replica re-created (kind repair).

    `started_at` is when the failure could first be detected (the failed host's last
    heartbeat plus the timeout), `detected_at` when the registry recorded it, and
    `completed_at` when the new host (or new holder) reported recovery.
    """

    __tablename__ = "failovers"

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(32))
    failed_id: Mapped[int | None] = mapped_column(ForeignKey("participants.id"), nullable=True, index=True)
    from_host_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    to_host_id: Mapped[int] = mapped_column(ForeignKey("participants.id"), index=True)
    from_epoch: Mapped[int] = mapped_column(Integer)
    to_epoch: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    detected_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    recovery_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    details: Mapped[dict] = mapped_column(JSON, default=dict)

    task: Mapped[Task] = relationship(lazy="joined")
    failed: Mapped[Participant | None] = relationship(foreign_keys=[failed_id], lazy="joined")
    from_host: Mapped[Participant] = relationship(foreign_keys=[from_host_id], lazy="joined")
    to_host: Mapped[Participant] = relationship(foreign_keys=[to_host_id], lazy="joined")


class SigningKey(Base):
    """A key the registry signs agents' call tokens with (Ed25519). The newest unretired one
    signs; a retired one still verifies for a grace period, so rotation breaks no call."""

    __tablename__ = "signing_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    kid: Mapped[str] = mapped_column(String(32), unique=True)
    private_pem: Mapped[str] = mapped_column(Text)
    public_pem: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class QuotaBucket(Base):
    """A token bucket of a quota (`api.quotas`): what `who` (a participant's name, or an
    address) has left of `action` at `at` (wall-clock seconds), refilled at the quota's rate."""

    __tablename__ = "quota_buckets"

    action: Mapped[str] = mapped_column(String(16), primary_key=True)
    who: Mapped[str] = mapped_column(String(128), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    at: Mapped[float] = mapped_column(Float)


class FeedStreamSlot(Base):
    """One of the change-feed streams a key may hold open at once (`api.quotas.FEED_STREAMS`):
    slot `slot` of the key whose hash is `key_id` is held by the stream `holder` (a random
    name) until `until` (wall-clock seconds), which the worker serving the stream renews while
    it lasts, so that a worker that died frees its streams' slots by then."""

    __tablename__ = "feed_stream_slots"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(32))
    until: Mapped[float] = mapped_column(Float)
