"""Request and response bodies of the JSON API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from api.limits import MAX_DURATION_S, MAX_ID, MAX_INT, MAX_LOAD, MAX_PRICE, check_json, sane_moment
from bpm import certificates
from bpm.names import NAME_PATTERN, PARTICIPANT_MAX, PARTICIPANT_PATTERN, TASK_MAX
from bpm.query import DIGEST_PATTERN, QUERY_NAME_PATTERN
from bpm.negotiation import MovementState, OfferState

HaMode = Literal["none", "upstream_backup", "passive_standby", "active_standby"]
Name = Field(min_length=1, max_length=PARTICIPANT_MAX, pattern=PARTICIPANT_PATTERN)
TaskName = Field(min_length=1, max_length=TASK_MAX, pattern=NAME_PATTERN)
Id = Annotated[int, Field(ge=1, le=MAX_ID)]
Epoch = Annotated[int, Field(ge=0, le=MAX_ID)]
SpanTime = Annotated[int, Field(ge=0, le=2**40, description="epoch seconds")]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
Load = Annotated[float, Field(ge=0, le=MAX_LOAD)]
Price = Annotated[float, Field(gt=0, le=MAX_PRICE)]
Moment = Annotated[datetime, AfterValidator(sane_moment)]


class In(BaseModel):
    """Inputs refuse unknown fields, non-finite numbers, NUL characters and integers beyond
    64 bits (also inside free-form objects), so bad input fails loudly with a 422."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        return check_json(data)


class Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


# Participants


def _certificate(text: str) -> str:
    try:
        return certificates.parse(text).pem
    except certificates.CertificateError as exc:
        raise ValueError(str(exc)) from None


CertificatePem = Annotated[
    str,
    Field(min_length=1, max_length=certificates.PEM_MAX,
          description="The TLS certificate the participant's agent serves (PEM, one certificate): partners trust it and no other for this participant"),
    AfterValidator(_certificate),
]


class ParticipantCreate(In):
    name: str = Name
    endpoint: str = Field(min_length=1, max_length=512, description="URL where the participant's agent listens")
    certificate: CertificatePem | None = None


class CertificateIn(In):
    certificate: CertificatePem


Liveness = Literal["new", "alive", "suspected", "failed"]


class ParticipantState(Out):
    """What a participant's heartbeat answers of it: all of `ParticipantOut` but its certificate."""

    name: str
    endpoint: str
    created_at: datetime
    status: Liveness
    heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    load: float | None
    threshold: float | None
    marginal_cost: dict | None
    hosted_tasks: list[int]
    key_revoked: bool = Field(default=False, description="The operator revoked its key: it can do nothing until given a new one")
    key_mark: str = Field(default="", description="Names its current API key without revealing it; a call token carries its caller's "
                                                  "mark, and an agent refuses a token whose caller's key has changed since (rotated or revoked)")


class ParticipantOut(ParticipantState):
    certificate: str | None = Field(default=None, description="The TLS certificate its agent and its broker serve (PEM), registered by the "
                                                              "participant; partners refuse a peer that shows another")
    certificate_sha256: str | None = Field(default=None, description="SHA-256 of that certificate (DER), hex")


class ChangeOut(Out):
    id: int
    kind: Literal["task", "offer", "contract", "keys"] = Field(description="What to read again: its tasks (and movements, replicas, failovers), its offers, its contracts, "
                                                                         "or the registry's signing keys (`GET /keys`, after a rotation)")


class HeartbeatOut(ParticipantState):
    changes: list[ChangeOut] = Field(description="Notices of changes that concern the participant and it has not acknowledged, oldest first")
    partners: dict[str, Liveness] = Field(
        description="Liveness of the participants that concern it: contract partners, origins and hosts of its tasks, holders of their replicas"
    )


class Identity(Out):
    name: str
    role: Literal["operator", "participant"]


class ParticipantCreated(ParticipantOut):
    api_key: str = Field(description="The participant's key: shown once, stored only as a hash")


class KeyRotated(Out):
    name: str
    api_key: str = Field(description="The participant's new key: shown once; the old one no longer works")


class KeyRevoked(Out):
    name: str
    key_revoked: bool


class TaskLoad(In):
    task_id: Id
    load: Load


class Heartbeat(In):
    load: Load = Field(description="Total load, as a fraction of the participant's capacity")
    threshold: Load | None = None
    marginal_cost: dict[str, float | None] | None = Field(
        default=None, description="e.g. {'shed': ..., 'take': ...} per unit of load"
    )
    tasks: list[TaskLoad] = Field(default_factory=list, max_length=10_000, description="Hosted tasks with their measured loads")
    details: dict = Field(default_factory=dict, description="Anything else the agent reports (cost model, backlog)")
    acknowledged: list[Annotated[int, Field(ge=1, le=MAX_INT)]] = Field(
        default_factory=list, max_length=10_000, description="Ids of the change notices the agent has acted on (deleted now)"
    )


class LoadSampleOut(Out):
    at: datetime
    load: float
    threshold: float | None


# Contracts


class ContractTermsIn(In):
    price_min: Price
    price_max: Price
    min_duration_s: float = Field(gt=0, le=MAX_DURATION_S)


class ContractCreate(ContractTermsIn):
    counterparty: str = Name
    valid_until: Moment | None = None
    ha_mode: HaMode = "none"


class ContractOut(Out):
    id: int
    proposer: str
    counterparty: str
    last_proposed_by: str
    awaiting: str | None = Field(description="The party whose answer the contract waits for, if negotiating")
    price_min: float
    price_max: float
    min_duration_s: float
    valid_until: datetime | None
    ha_mode: str
    state: str
    in_force: bool
    created_at: datetime
    updated_at: datetime


# Tasks


class TaskCreate(In):
    name: str = TaskName
    load: Load = 0.0
    input_uri: str | None = Field(default=None, max_length=1024, description="the origin's broker stream, nats://HOST:PORT/PARTICIPANT/KEY_GROUP_PREFIX (none: a task without input)")
    params: dict = Field(default_factory=dict)
    query: str | None = Field(default=None, pattern=QUERY_NAME_PATTERN, description="The name of the query it runs (bpm.query); with query_digest")
    query_digest: str | None = Field(default=None, pattern=DIGEST_PATTERN, description="The digest of that query's definition (bpm query show): a host runs the task only with a query of this digest")
    ha_mode: HaMode = "none"
    from_tasks: list[Id] = Field(
        default_factory=list, max_length=2,
        description="The caller's tasks this one came from: one it splits (its input a half of that task's key groups) or two halves it merges (its input their share); none for a new task",
    )
    since_s: SpanTime | None = Field(
        default=None,
        description="With from_tasks (and only with them): the event time, epoch seconds at a window start, from which this task takes its key groups' rows; "
                    "the tasks it came from end there (their until_s), each at one time only",
    )

    @model_validator(mode="after")
    def _query_and_digest(self) -> TaskCreate:
        if (self.query is None) != (self.query_digest is None):
            raise ValueError("query and query_digest come together: the query's name and the digest of its definition")
        return self


class TaskOut(Out):
    id: int
    name: str
    origin: str
    host: str
    away: bool
    load: float
    input_uri: str | None
    params: dict
    query: str | None = Field(description="The query it runs (bpm.query), none for a task registered without one")
    query_digest: str | None = Field(description="The digest of that query's definition")
    ha_mode: str
    epoch: int
    from_tasks: list[int] = Field(description="The tasks it came from by a split or a merge")
    since_s: int | None = Field(description="Where its span of event time starts (a task a split or merge made), epoch seconds")
    until_s: int | None = Field(description="Where its span ends: it handed its key groups over to the tasks a split or merge made")
    retired: bool = Field(description="Its last window is out and its origin retired it: it runs nowhere again")


# Offers and movements


class OfferCreate(In):
    contract_id: Id
    task_ids: list[Id] = Field(min_length=1, max_length=1000)
    price: Price = Field(description="The offerer's cap for the whole set, per unit of load")
    caps: list[Price] | None = Field(
        default=None, max_length=1000,
        description="For each k, the offerer's cap for the first k tasks (one per task, not increasing, the last equal to price); price for every k by default",
    )
    loads: list[Load] | None = Field(
        default=None, max_length=1000,
        description="Each task's load as the offerer measured it when pricing the offer (one per task); the load the registry last heard by default. "
                    "A movement is paid on its host's measurements, bounded by this load (api.limits.BILLED_LOAD_SLACK times it)",
    )
    ttl_s: float = Field(default=30.0, gt=0, le=3600, description="The offer expires unless decided within this time")


class OfferAccept(In):
    task_ids: list[Id] | None = Field(default=None, min_length=1, max_length=1000, description="A subset of the offer's tasks; all by default")
    price: Price | None = Field(
        default=None,
        description="The settled price: at least the contract's price_min, at most the offerer's cap for as many tasks as are taken; that cap by default",
    )


class OfferReject(In):
    reason: str | None = Field(default=None, max_length=1000)


class OfferOut(Out):
    id: int
    contract_id: int
    from_: str = Field(alias="from")
    to: str
    task_ids: list[int]
    accepted_task_ids: list[int] | None
    price: float = Field(description="the offerer's cap per unit of load, for the whole set")
    caps: list[float] = Field(description="the offerer's cap for the first k tasks, for each k")
    loads: list[float] | None = Field(default=None, description="each task's load as the offerer declared it")
    settled_price: float | None = Field(default=None, description="once accepted, the price its movements run at")
    state: OfferState
    reason: str | None
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    movements: list[int] = Field(default_factory=list)


class MovementOut(Out):
    id: int
    offer_id: int
    contract_id: int
    task_id: int
    task_name: str
    origin: str
    from_: str = Field(alias="from")
    to: str
    price: float
    load: float = Field(description="the load it is paid on: its host's last measurement, bounded by the declared load")
    declared_load: float | None = Field(default=None, description="the task's load as the offer declared it")
    state: MovementState
    started_at: datetime
    earliest_end_at: datetime
    ended_at: datetime | None
    accrued: float


# Ledger and events


class LedgerEntry(Out):
    movement_id: int
    task_id: int
    from_: str = Field(alias="from")
    to: str
    price: float
    load: float
    seconds: float
    amount: float
    state: MovementState


class LedgerBalance(Out):
    participant: str
    paid: float
    earned: float
    balance: float


class LedgerOut(Out):
    as_of: datetime
    balances: list[LedgerBalance]
    entries: list[LedgerEntry]


class EventCreate(In):
    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")
    message: str = Field(min_length=1, max_length=4000)
    subject: str | None = Field(default=None, max_length=PARTICIPANT_MAX, pattern=PARTICIPANT_PATTERN)
    data: dict = Field(default_factory=dict)


class EventOut(Out):
    id: int
    at: datetime
    kind: str
    actor: str | None
    subject: str | None
    message: str
    data: dict


# High availability

ReplicaRole = Literal["active_standby", "passive_standby"]
ReplicaState = Literal["active", "promoted", "failed", "dropped"]
FailoverKind = Literal["failover", "repair"]


class ReplicaCreate(In):
    participant: str = Name
    role: ReplicaRole | None = Field(default=None, description="The task's HA mode by default, when it is a standby mode")
    repair_of: Id | None = Field(default=None, description="The failover whose lost replica this one replaces: records a repair")


class ReplicaSync(In):
    epoch: Epoch = Field(description="The task epoch the copy belongs to; older than the task's is refused (fencing)")
    position: Count | None = Field(default=None, description="Stream position of the copy or of the replica's last batch")
    bytes_copied: Count | None = Field(default=None, description="Bytes copied by this sync, added to the total")


class ReplicaOut(Out):
    id: int
    task_id: int
    task: str = Field(description="origin.name")
    participant: str = Field(description="The holder")
    role: str
    state: ReplicaState
    epoch: int
    position: int | None
    synced_at: datetime | None
    bytes_copied: int
    created_at: datetime
    updated_at: datetime


class ReplicaCreated(ReplicaOut):
    repair_id: int | None = Field(default=None, description="The repair record written when `repair_of` was given")


class FailoverCreate(In):
    to: str = Name
    expected_epoch: Epoch = Field(description="The task epoch the caller saw; the failover happens only if it is still current")
    reason: str | None = Field(default=None, max_length=1000)


class FailoverComplete(In):
    recovery_s: float | None = Field(default=None, ge=0, le=MAX_DURATION_S, description="Failure to first output; from started_at to now by default")
    details: dict | None = None


class FailoverOut(Out):
    id: int
    task_id: int
    task: str = Field(description="origin.name")
    kind: FailoverKind
    mode: str
    failed: str | None
    from_host: str
    to_host: str
    from_epoch: int
    to_epoch: int
    reason: str | None
    detected_at: datetime
    started_at: datetime
    completed_at: datetime | None
    recovery_s: float | None
    details: dict
    at: datetime = Field(description="= detected_at")


class ParticipantView(Out):
    """What concerns one participant, in one read: what its agent reads when its change feed says its tasks changed."""

    tasks: list[TaskOut] = Field(description="tasks it originates, hosts or keeps a replica of")
    movements: list[MovementOut] = Field(description="movements it is party to or whose task it originates")
    replicas: list[ReplicaOut] = Field(description="replicas of the tasks that concern it")
    failovers: list[FailoverOut] = Field(description="failovers and repairs of the tasks that concern it")


# Path and query parameters: bounded like the bodies, so a hostile URL is a 422 too

IdPath = Annotated[int, Path(ge=1, le=MAX_ID)]
IdQuery = Annotated[int | None, Query(ge=0, le=MAX_ID)]
# Call tokens between agents


class TokenCreate(In):
    task_id: Id | None = Field(default=None, description="The task the call is about (none for alerts)")
    purpose: Literal["handover", "delta", "stream", "alerts"] = Field(
        description="handover: fetch the task's checkpoint from its previous host; delta: send an HA delta to a replica's holder; "
                    "stream: ask the task's origin for the credentials that read its broker stream; "
                    "alerts: ask a contract partner for the credentials that read the alerts it shares")
    audience: str = Field(min_length=1, max_length=PARTICIPANT_MAX, pattern=PARTICIPANT_PATTERN, description="The participant the call goes to")
    epoch: Epoch | None = Field(default=None, description="The task's epoch the call is for: the caller must host the task at it (none for alerts)")

    @model_validator(mode="after")
    def _about_a_task(self) -> TokenCreate:
        if self.purpose == "alerts" and (self.task_id is not None or self.epoch is not None):
            raise ValueError("a token for alerts is about no task: leave task_id and epoch out")
        if self.purpose != "alerts" and (self.task_id is None or self.epoch is None):
            raise ValueError(f"a token for {self.purpose} is about one task at one epoch: task_id and epoch are required")
        return self


class TokenOut(Out):
    token: str = Field(description="A JWT (EdDSA) the registry signed; send it as 'Authorization: Bearer <token>' to the audience's agent")
    expires_at: datetime
    kid: str


class KeyOut(Out):
    kid: str
    public_key: str = Field(description="Ed25519 public key, PEM")
    created_at: datetime
    retired_at: datetime | None


NamePath = Annotated[str, Path(min_length=1, max_length=PARTICIPANT_MAX, pattern=PARTICIPANT_PATTERN)]
NameQuery = Annotated[str | None, Query(min_length=1, max_length=PARTICIPANT_MAX, pattern=PARTICIPANT_PATTERN)]
WordQuery = Annotated[str | None, Query(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.]*$")]
OfferStateQuery = Annotated[OfferState | None, Query(description="Only offers in this state.")]
MovementStateQuery = Annotated[MovementState | None, Query(description="Only movements in this state.")]
MomentQuery = Annotated[Moment | None, Query()]
