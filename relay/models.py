"""Typed SQLAlchemy 2.0 models; the schema itself lives in Alembic revisions."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, declared_attr, mapped_column, relationship

from relay.extensions import db

# The handoff's states (docs/api.md, "Transition result"): input_required is accepted work
# waiting on an answer from its requester; TERMINAL_STATES are final.
THREAD_STATES = ("pending", "accepted", "completed", "cancelled", "declined", "failed", "expired", "input_required")
TERMINAL_STATES = ("completed", "cancelled", "declined", "failed", "expired")
PRIORITIES = ("low", "normal", "high", "urgent")


@dataclass(frozen=True)
class ClockRule:
    """What the clock does to a handoff: once ``deadline`` (a column) has passed, ``source`` becomes ``target``."""

    source: str
    deadline: str
    target: str

    def due(self, thread: Any, now: datetime) -> bool:
        """Return whether the rule applies to ``thread`` (a :class:`Thread`, or an object with its columns) at ``now``."""
        at = getattr(thread, self.deadline)
        return thread.state == self.source and at is not None and at <= now


# The clock's rules, in the order they apply (docs/decisions.md, "The work lifecycle"): a
# leased accepted handoff whose lease lapsed is pending again, and a pending one past its
# expiry is expired (also one whose lease just lapsed). Each state is the source of one rule
# at most. The reads compute them in SQL (effective_state_sql, expired_at_sql) and
# relay.services.threads.clock.settle records them, each from this table.
CLOCK_RULES = (
    ClockRule("accepted", "lease_expires_at", "pending"),
    ClockRule("pending", "expires_at", "expired"),
)
if len({r.source for r in CLOCK_RULES}) != len(CLOCK_RULES):
    raise ValueError("each state is the source of one clock rule at most")


def _state_after(t: str, now: str, rules: tuple[ClockRule, ...], state: str) -> str:
    """The SQL of the state ``rules`` make of the known ``state`` as of ``now``."""
    for i, rule in enumerate(rules):
        if rule.source == state:
            passed = _state_after(t, now, rules[i + 1 :], rule.target)
            kept = _state_after(t, now, rules[i + 1 :], state)
            return f"CASE WHEN {t}.{rule.deadline} <= {now} THEN {passed} ELSE {kept} END"
    return f"'{state}'"


def effective_state_sql(t: str = "threads", now: str = "now()") -> str:
    """The SQL of thread ``t``'s state as of ``now``, whether or not the sweep has recorded it.

    :data:`CLOCK_RULES` applied in order (at once, in every read: docs/decisions.md, "The
    work lifecycle"): the first rule due from the recorded state, then those after it due
    from the state it makes.
    """
    whens = "".join(
        f" WHEN {t}.state = '{rule.source}' AND {t}.{rule.deadline} <= {now}"
        f" THEN {_state_after(t, now, CLOCK_RULES[i + 1 :], rule.target)}"
        for i, rule in enumerate(CLOCK_RULES)
    )
    return f"CASE{whens} ELSE {t}.state END"


def expired_at_sql(t: str = "threads", now: str = "now()") -> str:
    """The SQL of the moment thread ``t`` expired, as of ``now``: its ``expired_at`` once
    recorded, else the moment :func:`effective_state_sql` makes it ``expired``, else NULL.

    A rule takes effect at its deadline, or later when the state it applies to began later:
    the deadline of the rule before it in one reading of the clock (a lease that lapsed
    after ``expires_at``: its ``lease_expires_at``), else the recorded state's ``updated_at``
    (a release after it: the release's time). relay.services.threads.clock.settle records
    the same moment, whenever it runs.
    """
    whens = []
    for i, first in enumerate(CLOCK_RULES):
        run = [first]  # the rules one reading of the clock applies from first's state, up to expired
        for rule in CLOCK_RULES[i + 1 :]:
            if run[-1].target != "expired" and rule.source == run[-1].target:
                run.append(rule)
        if run[-1].target != "expired":
            continue
        began = f"{t}.{run[-2].deadline}" if len(run) > 1 else f"{t}.updated_at"
        due = " AND ".join(f"{t}.{rule.deadline} <= {now}" for rule in run)
        whens.append(f" WHEN {t}.state = '{first.source}' AND {due} THEN greatest({t}.{run[-1].deadline}, {began})")
    return f"coalesce({t}.expired_at, CASE{''.join(whens)} END)"


INTENTS = ("inform", "ask_question", "propose_action")
# Idempotency keys of A2A SendMessage calls are "a2a:" + messageId, beside ``POST /a2a`` keys of
# the same agent; that dialect's clients may not use the prefix, so neither can replay the other's call.
RESERVED_KEY_PREFIX = "a2a:"
# The version of the search document's definition (relay.services.search.document_vector)
# that the indexer writes into messages.search_version; NULL beside a vector is version 1
# (written before migration 0007 added the column). Rows with an older vector are reindexed
# by the beat sweep, found through ix_messages_stale_vector, whose predicate names this
# number: changing the definition means bumping it and recreating that index (CONCURRENTLY) in a migration.
SEARCH_VERSION = 2

TZ = DateTime(timezone=True)

#: The tables in daily time partitions (migration 0009), each with its partition key.
#: Their primary keys are (id, key) in PostgreSQL, since a partitioned table's unique
#: constraints must include the key; the ORM maps ``id`` alone (:class:`_PartitionedById`).
PARTITIONED = {
    "events": "created_at",
    "webhook_deliveries": "created_at",
    "webhook_attempts": "attempted_at",
    "idempotency_records": "created_at",
    "operator_audit": "created_at",
}
_PARTITION_NAME = re.compile(r"^(" + "|".join(PARTITIONED) + r")_(legacy|p\d{8})$")


def is_partition(name: str) -> bool:
    """True for a partition of a :data:`PARTITIONED` table (``<table>_legacy``, ``<table>_pYYYYMMDD``).

    Partitions are made and dropped by retention, not described by the models: Alembic's
    comparison skips them (migrations/env.py).
    """
    return bool(_PARTITION_NAME.match(name))


class _PartitionedById:
    """Maps a partitioned table by ``id`` alone (its primary key is ``(id, <time column>)``, as
    partitioning requires), so ORM code reads and writes it by ``id``."""

    _eager_defaults = False

    @declared_attr.directive
    def __mapper_args__(cls) -> dict:
        return {"primary_key": [cls.__table__.c.id], "eager_defaults": cls._eager_defaults}


class Agent(db.Model):
    """An agent identity ``local@org``; teammates share an org."""

    __tablename__ = "agents"
    __table_args__ = (
        CheckConstraint("handle = lower(handle)", name="handle_lower"),
        CheckConstraint(r"handle ~ '^[a-z0-9._-]+@[a-z0-9.-]+$'", name="handle_format"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    handle: Mapped[str] = mapped_column(String(320), unique=True)
    org: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    disabled_at: Mapped[datetime | None] = mapped_column(TZ)

    __mapper_args__ = {"eager_defaults": True}


class Generation(db.Model):
    """A value that changes whenever cached state of that name may be stale (migration 0006's triggers)."""

    __tablename__ = "relay_generations"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class Floor(db.Model):
    """The oldest ``created_at`` a pending row of a partitioned queue can have (migration 0011)."""

    __tablename__ = "relay_floors"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    floor: Mapped[datetime] = mapped_column(TZ)


class RelayWorker(db.Model):
    """A running webhook pump (one per worker process) and its last heartbeat (migration 0010)."""

    __tablename__ = "relay_workers"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    hostname: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    heartbeat_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class ApiKey(db.Model):
    """An API key; only the SHA-256 digest of the secret is stored."""

    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    digest: Mapped[bytes] = mapped_column(LargeBinary(32), unique=True)
    label: Mapped[str] = mapped_column(String(200), default="")
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    last_used_at: Mapped[datetime | None] = mapped_column(TZ)
    revoked_at: Mapped[datetime | None] = mapped_column(TZ)

    agent: Mapped[Agent] = relationship()

    __mapper_args__ = {"eager_defaults": True}


class Thread(db.Model):
    """A handoff thread (A2A task); ``id`` is a ULID stored as a UUID."""

    __tablename__ = "threads"
    __table_args__ = (
        CheckConstraint(
            "state in ('pending','accepted','completed','cancelled','declined','failed','expired','input_required')",
            name="state_valid",
        ),
        CheckConstraint("intent in ('inform','ask_question','propose_action')", name="intent_valid"),
        CheckConstraint("priority in ('low','normal','high','urgent')", name="priority_valid"),
        Index("ix_threads_recipient_activity", "recipient_id", text("updated_at DESC"), text("id DESC")),
        Index("ix_threads_sender_activity", "sender_id", text("updated_at DESC"), text("id DESC")),
        Index("ix_threads_context", "context_id"),
        # What the sweep settles: leased accepted rows, and pending rows with an expiry.
        Index(
            "ix_threads_lease_due",
            "lease_expires_at",
            postgresql_where=text("state = 'accepted' AND lease_expires_at IS NOT NULL"),
        ),
        Index(
            "ix_threads_expiry_due", "expires_at", postgresql_where=text("state = 'pending' AND expires_at IS NOT NULL")
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    context_id: Mapped[uuid.UUID]
    sender_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    recipient_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    intent: Mapped[str] = mapped_column(String(32), default="inform")
    summary: Mapped[str] = mapped_column(Text)
    proposed_action: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    version: Mapped[int] = mapped_column(Integer, default=1)
    result_summary: Mapped[str | None] = mapped_column(Text)
    last_sequence_no: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    accepted_at: Mapped[datetime | None] = mapped_column(TZ)
    completed_at: Mapped[datetime | None] = mapped_column(TZ)
    cancelled_at: Mapped[datetime | None] = mapped_column(TZ)
    declined_at: Mapped[datetime | None] = mapped_column(TZ)
    failed_at: Mapped[datetime | None] = mapped_column(TZ)
    expired_at: Mapped[datetime | None] = mapped_column(TZ)
    priority: Mapped[str] = mapped_column(String(8), server_default="normal")
    # A pending handoff past this is expired (create's expires_in_seconds).
    expires_at: Mapped[datetime | None] = mapped_column(TZ)
    # A lease (accept's lease_seconds): past lease_expires_at the handoff is pending again;
    # lease_token fences complete/fail/release/renew to the session that holds it.
    lease_expires_at: Mapped[datetime | None] = mapped_column(TZ)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_seconds: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(Text)  # of the decline or fail that ended it
    # The open question of an input_required handoff (request_input) and when it was asked;
    # both null in every other state.
    question: Mapped[str | None] = mapped_column(Text)
    input_requested_at: Mapped[datetime | None] = mapped_column(TZ)

    sender: Mapped[Agent] = relationship(foreign_keys=[sender_id], lazy="joined", innerjoin=True)
    recipient: Mapped[Agent] = relationship(foreign_keys=[recipient_id], lazy="joined", innerjoin=True)

    __mapper_args__ = {"eager_defaults": True}


class Message(db.Model):
    """One message of a thread; ``sequence_no`` is gapless per thread."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("thread_id", "sequence_no", name="uq_messages_thread_seq"),
        CheckConstraint("role in ('caller','agent')", name="role_valid"),
        # Feed by participant, newest first: caller_id/target_id are copied from the
        # thread so the feed never has to join before it can use an index.
        Index("ix_messages_caller_feed", "caller_id", text("created_at DESC"), text("id DESC")),
        Index("ix_messages_target_feed", "target_id", text("created_at DESC"), text("id DESC")),
        Index("ix_messages_search", "search_vector", postgresql_using="gin"),
        Index("ix_messages_unindexed", "created_at", postgresql_where=text("search_vector IS NULL")),
        Index(
            "ix_messages_stale_vector",
            "created_at",
            postgresql_where=text(
                f"search_vector IS NOT NULL AND index_error IS NULL AND coalesce(search_version, 1) < {SEARCH_VERSION}"
            ),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    sequence_no: Mapped[int] = mapped_column(Integer)
    author_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    caller_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    target_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    role: Mapped[str] = mapped_column(String(8))
    body: Mapped[str] = mapped_column(Text)
    parts: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    artifacts: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    # The read receipt: when the other participant's read position first reached it.
    read_at: Mapped[datetime | None] = mapped_column(TZ)
    search_vector: Mapped[Any | None] = mapped_column(TSVECTOR)
    # Why the indexer could not write search_vector ("SQLSTATE: first line"); the sweep
    # skips such rows and search does not find them by text (relay.services.search).
    index_error: Mapped[str | None] = mapped_column(Text)
    # The SEARCH_VERSION that wrote search_vector (NULL: not indexed yet, or before 0007).
    search_version: Mapped[int | None] = mapped_column(SmallInteger)

    thread: Mapped[Thread] = relationship()
    author: Mapped[Agent] = relationship(foreign_keys=[author_id])

    __mapper_args__ = {"eager_defaults": True}


class ReadPosition(db.Model):
    """How far a participant has read a thread."""

    __tablename__ = "read_positions"

    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"), primary_key=True)
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    last_read_sequence_no: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class IdempotencyRecord(_PartitionedById, db.Model):
    """The first answer to a call made with a client idempotency key, per agent.

    No unique constraint on (agent_id, key): it would have to include created_at, the
    partition key. relay/services/idempotency.py serialises a key's calls instead.
    """

    __tablename__ = "idempotency_records"
    __table_args__ = (Index("ix_idempotency_records_agent_key", "agent_id", "key"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    response: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(TZ, primary_key=True, server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(TZ)


class Block(db.Model):
    """``blocker`` refuses new handoffs from ``blocked``."""

    __tablename__ = "blocks"

    blocker_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    blocked_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())


class AuditEvent(db.Model):
    """One row per create, append and transition of a thread."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    thread_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"), index=True)
    actor_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id"))
    action: Mapped[str] = mapped_column(String(16))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    session_id: Mapped[str | None] = mapped_column(String(255))
    result_summary: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    question: Mapped[str | None] = mapped_column(Text)  # a request_input's
    message_id: Mapped[uuid.UUID | None]
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())

    actor: Mapped[Agent] = relationship()


class Event(_PartitionedById, db.Model):
    """Transactional outbox: written with the change it announces, fanned out after commit."""

    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_pending", "created_at", postgresql_where=text("fanned_out_at IS NULL")),
        # Deleting a closed thread (opt-in retention) cascades into its events by thread_id.
        Index("ix_events_thread_id", "thread_id", postgresql_where=text("thread_id IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    type: Mapped[str] = mapped_column(String(64))
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    thread_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    message_id: Mapped[uuid.UUID | None]
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(TZ, primary_key=True, server_default=func.now())
    fanned_out_at: Mapped[datetime | None] = mapped_column(TZ)


class WebhookEndpoint(db.Model):
    """A subscriber URL of one agent; its signing secret is stored encrypted.

    ``kind`` is ``webhook`` (REST subscriptions: every event addressed to the agent) or
    ``a2a_push`` (an A2A v1.0 push notification config: the events addressed to the agent
    on one thread, with the client's ``token`` and optional ``authentication``). Both go
    through the same outbox, deliveries and retries.
    """

    __tablename__ = "webhook_endpoints"
    __table_args__ = (
        CheckConstraint("kind in ('webhook','a2a_push')", name="kind_valid"),
        CheckConstraint(
            "(kind = 'a2a_push') = (thread_id IS NOT NULL AND push_config_id IS NOT NULL)",
            name="push_config_has_thread",
        ),
        UniqueConstraint("thread_id", "push_config_id", name="uq_webhook_endpoints_thread_push_config"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    kind: Mapped[str] = mapped_column(String(16), default="webhook", server_default="webhook")
    # Indexed by the leading column of uq_webhook_endpoints_thread_push_config.
    thread_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("threads.id", ondelete="CASCADE"))
    push_config_id: Mapped[str | None] = mapped_column(Text)
    token_encrypted: Mapped[str | None] = mapped_column(Text)
    auth_scheme: Mapped[str | None] = mapped_column(Text)
    auth_credentials_encrypted: Mapped[str | None] = mapped_column(Text)
    agent_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    events: Mapped[list[str]] = mapped_column(JSONB)
    enabled: Mapped[bool] = mapped_column(default=True)
    secret_encrypted: Mapped[str] = mapped_column(Text)
    previous_secret_encrypted: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(TZ)
    failing_since: Mapped[datetime | None] = mapped_column(TZ)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    disabled_at: Mapped[datetime | None] = mapped_column(TZ)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    # Health, written by the delivery pipeline (relay/services/delivery/circuit.py): failures in a
    # row, the circuit breaker (how often it opened in a row, until when, why) and the
    # last attempt's outcome.
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    circuit_opens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    circuit_open_until: Mapped[datetime | None] = mapped_column(TZ)
    circuit_reason: Mapped[str | None] = mapped_column(Text)
    last_attempt_at: Mapped[datetime | None] = mapped_column(TZ)
    last_duration_ms: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)

    __mapper_args__ = {"eager_defaults": True}


class WebhookDelivery(_PartitionedById, db.Model):
    """One event to one endpoint; attempted until it succeeds or the schedule runs out.

    ``created_at`` is its event's, so a delivery lives in the partition of the same day
    as its event, and (event_id, endpoint_id, created_at) is unique per (event, endpoint).
    ``event_id`` has no foreign key (migration 0009: the events are partitioned too).
    """

    __tablename__ = "webhook_deliveries"
    _eager_defaults = True
    __table_args__ = (
        UniqueConstraint("event_id", "endpoint_id", "created_at", name="uq_webhook_deliveries_event_endpoint"),
        CheckConstraint("status in ('pending','succeeded','failed')", name="status_valid"),
        Index("ix_webhook_deliveries_due", "next_attempt_at", postgresql_where=text("status = 'pending'")),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", text("created_at DESC"), text("id DESC")),
        Index(
            "ix_webhook_deliveries_leased",
            "endpoint_id",
            "leased_until",
            postgresql_where=text("leased_until IS NOT NULL"),
        ),
        Index(
            "ix_webhook_deliveries_endpoint_due",
            "endpoint_id",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("ix_webhook_deliveries_claimed_by", "claimed_by", postgresql_where=text("leased_until IS NOT NULL")),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    event_id: Mapped[uuid.UUID]
    endpoint_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(TZ)
    # Set while an attempt is in flight (claimed, not yet recorded); counted by the caps.
    leased_until: Mapped[datetime | None] = mapped_column(TZ)
    # The pump (relay_workers.id) holding the lease: its death releases the lease early.
    claimed_by: Mapped[uuid.UUID | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, primary_key=True, server_default=func.now())
    completed_at: Mapped[datetime | None] = mapped_column(TZ)

    event: Mapped[Event] = relationship(primaryjoin="foreign(WebhookDelivery.event_id) == Event.id")
    endpoint: Mapped[WebhookEndpoint] = relationship()


class WebhookAttempt(_PartitionedById, db.Model):
    """One HTTP attempt of a delivery: status or error, and how long it took.

    ``delivery_id`` has no foreign key (migration 0009): attempts go with their time
    partition, and the closed-thread sweep deletes a thread's attempts itself.
    """

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    delivery_id: Mapped[uuid.UUID] = mapped_column(index=True)
    attempted_at: Mapped[datetime] = mapped_column(TZ, primary_key=True)
    status_code: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[int] = mapped_column(Integer)


class CircuitOpening(db.Model):
    """One opening of an endpoint's circuit: when, until when, why (the console's circuit spans).

    Written by the pump in the transaction that opens the circuit; retention deletes rows
    older than :data:`relay.services.retention.CIRCUIT_KEEP` (an endpoint opens at most
    once per pause, so the table stays small).
    """

    __tablename__ = "circuit_openings"
    __table_args__ = (Index("ix_circuit_openings_endpoint", "endpoint_id", "opened_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    opened_at: Mapped[datetime] = mapped_column(TZ)
    until: Mapped[datetime] = mapped_column(TZ)
    reason: Mapped[str] = mapped_column(Text)


REDRIVE_STATES = ("running", "done", "failed")


class RedriveJob(db.Model):
    """A bulk redrive (docs/console.md): an endpoint's failed deliveries of a window, sent again in batches.

    ``id`` is made by the preview page, so confirming twice makes one job. ``total`` is how
    many were failed when it was confirmed; ``done`` how many it has redriven; the keyset
    ``(cursor_created_at, cursor_id)`` is the last one, so no delivery is taken twice.
    """

    __tablename__ = "redrive_jobs"
    __table_args__ = (CheckConstraint("status IN ('running', 'done', 'failed')", name="status_known"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True)
    since: Mapped[datetime] = mapped_column(TZ)
    until: Mapped[datetime] = mapped_column(TZ)
    requested_by: Mapped[str] = mapped_column(String(320))
    total: Mapped[int] = mapped_column(Integer)
    done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cursor_created_at: Mapped[datetime | None] = mapped_column(TZ)
    cursor_id: Mapped[uuid.UUID | None]
    status: Mapped[str] = mapped_column(String(16), default="running", server_default="running")
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    finished_at: Mapped[datetime | None] = mapped_column(TZ)


class OperatorAudit(_PartitionedById, db.Model):
    """One operator's sign-in, failed sign-in, sign-out or console action (docs/console.md).

    Written in the transaction of the action it records; a refused action leaves only its
    refusal (``outcome`` the reason's symbol). ``operator_id`` is null for a failed
    sign-in, whose ``operator_email`` is the email typed; ``org`` is the operator's.
    """

    __tablename__ = "operator_audit"
    __table_args__ = (Index("ix_operator_audit_org", "org", text("created_at DESC"), text("id DESC")),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(TZ, primary_key=True, server_default=func.now())
    operator_id: Mapped[uuid.UUID | None]
    operator_email: Mapped[str] = mapped_column(String(320))
    org: Mapped[str | None] = mapped_column(String(255))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(Text, default="", server_default="")
    outcome: Mapped[str] = mapped_column(String(64))
    client_addr: Mapped[str] = mapped_column(String(64), default="", server_default="")


class Operator(db.Model):
    """A human who signs in to the console (relay/transport/console); sees one org's agents.

    Only an argon2 hash of the password is stored. ``session_version`` is written into
    each sign-in's session: a password reset or a disable moves it on, which ends every
    session signed in before.
    """

    __tablename__ = "operators"
    __table_args__ = (
        CheckConstraint("email = lower(email)", name="email_lower"),
        CheckConstraint("role IN ('admin', 'viewer')", name="role_known"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    org: Mapped[str] = mapped_column(String(255), index=True)
    password_hash: Mapped[str] = mapped_column(Text)
    session_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    password_changed_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    last_sign_in_at: Mapped[datetime | None] = mapped_column(TZ)
    disabled_at: Mapped[datetime | None] = mapped_column(TZ)
    # admin: every page and action of its org; viewer: every page, no action (docs/decisions.md, "Console roles").
    role: Mapped[str] = mapped_column(String(16), default="admin", server_default="admin")

    __mapper_args__ = {"eager_defaults": True}

    @property
    def may_act(self) -> bool:
        """Whether this operator may change anything (an admin), not only look (a viewer)."""
        return self.role == "admin"


SIGNING_ALGORITHMS = ("ES256", "EdDSA")


class SigningKey(db.Model):
    """A key that signs the A2A agent cards (relay/services/signing.py); a handful of rows.

    Every key with ``retired_at`` null signs every card; a retired key signs nothing and
    stays in the published key set (``/.well-known/jwks.json``) for the grace period
    (``RELAY_SIGNING_KEY_GRACE_DAYS``) after ``retired_at``. ``public_jwk`` is the RFC 7517
    public JWK as published (``kty``, ``crv``, ``x``[, ``y``], ``kid``, ``alg``, ``use``);
    ``private_key_encrypted`` the PKCS#8 PEM under ``RELAY_SECRET_KEY`` (relay/crypto.py).
    """

    __tablename__ = "signing_keys"
    __table_args__ = (CheckConstraint("alg IN ('ES256', 'EdDSA')", name="alg_known"),)

    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    alg: Mapped[str] = mapped_column(String(16))
    public_jwk: Mapped[dict[str, Any]] = mapped_column(JSONB)
    private_key_encrypted: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=func.now())
    retired_at: Mapped[datetime | None] = mapped_column(TZ)

    __mapper_args__ = {"eager_defaults": True}
