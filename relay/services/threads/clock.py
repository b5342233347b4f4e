"""What the clock does to a handoff: a lapsed lease or an expiry, recorded for one thread or by the sweep."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from relay.models import CLOCK_RULES, ClockRule, Thread
from relay.services import unit_of_work
from relay.services.threads.common import _announce, _now
from relay.services.threads.rules import EXPIRED, LEASE_EXPIRED


def settle(session: Session, thread: Thread, now: datetime) -> bool:
    """Record what the clock did to a locked ``thread`` by ``now``; return whether it changed.

    Each rule of relay.models.CLOCK_RULES due, in order, is recorded: a leased ``accepted``
    handoff past ``lease_expires_at`` goes back to ``pending`` (audit ``lease_expired``); a
    ``pending`` one past ``expires_at`` is ``expired`` (audit ``expire``). Each writes a
    ``task.updated`` event to both participants. The reads compute the same rules
    (relay.models.effective_state_sql) before they are recorded.

    ``expired_at`` is the moment the handoff expired (relay.models.expired_at_sql): its
    ``expires_at``, or the later moment it was pending again. ``updated_at``, the audit
    rows and the events carry ``now``, when the change is recorded (docs/decisions.md,
    "When a handoff expired").
    """
    changed = False
    # When the state a rule applies to began: the deadline of the rule recorded before it
    # here (a lease that lapses is pending from its end), else the recorded state's updated_at.
    began = thread.updated_at
    for rule in CLOCK_RULES:
        if rule.due(thread, now):
            deadline = getattr(thread, rule.deadline)
            _RECORD[rule.target](session, thread, rule, now, max(deadline, began))
            began = deadline
            changed = True
    if changed:
        session.flush()
    return changed


def _lapse(session: Session, thread: Thread, rule: ClockRule, now: datetime, _at: datetime) -> None:
    """Record a lapsed lease: the handoff is pending again (``_at``, the lease's end, is not stored)."""
    _return_to_pending(thread, now)
    _announce(session, thread, thread.recipient_id, LEASE_EXPIRED, rule.source, rule.target, now,
              to=(thread.sender_id, thread.recipient_id))  # fmt: skip


def _expire(session: Session, thread: Thread, rule: ClockRule, now: datetime, at: datetime) -> None:
    """Record an expiry that took effect ``at``."""
    # expired_at is the moment it expired, not the moment it is recorded; updated_at
    # is when the relay recorded the change, which `since=` catch-up relies on.
    thread.state, thread.expired_at = rule.target, at
    thread.version += 1
    thread.updated_at = now
    _announce(session, thread, thread.sender_id, EXPIRED, rule.source, rule.target, now,
              to=(thread.sender_id, thread.recipient_id))  # fmt: skip


# How each rule's change is recorded, by the state it makes.
_RECORD = {"pending": _lapse, "expired": _expire}
if set(_RECORD) != {rule.target for rule in CLOCK_RULES}:
    raise ValueError("every clock rule's target state needs its record function")


def _return_to_pending(thread: Thread, now: datetime) -> None:
    """Give the work back: no lease, no accept time (a release, or a lease that lapsed)."""
    thread.state = "pending"
    thread.version += 1
    thread.updated_at = now
    thread.accepted_at = None
    thread.lease_expires_at = thread.lease_token = thread.lease_seconds = None


SWEEP_BATCH = 500


def settle_due(limit: int = SWEEP_BATCH) -> int:
    """Record up to ``limit`` lapsed leases and expiries (beat's ``settle_due``); return how many.

    Rows another transaction holds are skipped (SKIP LOCKED): that one settles them itself.
    """
    with unit_of_work() as session:
        now = _now(session)
        due = session.scalars(
            select(Thread)
            .where(or_(*(and_(Thread.state == r.source, getattr(Thread, r.deadline) <= now) for r in CLOCK_RULES)))
            .order_by(Thread.id)
            .limit(limit)
            .with_for_update(of=Thread, skip_locked=True)
        ).all()
        return sum(settle(session, thread, now) for thread in due)


def _due(thread: Thread, now: datetime) -> bool:
    """Whether :func:`settle` would change ``thread`` at ``now``."""
    return any(rule.due(thread, now) for rule in CLOCK_RULES)
