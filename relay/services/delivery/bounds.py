"""The pending floors and ceiling: the bounds that keep each scan of pending rows to the partitions that can hold them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from relay.services import unit_of_work

# A scan for pending rows (deliveries due or leased, events not fanned out) cannot prune
# by day on its own: such a row can be in any day retention keeps, so PostgreSQL planned
# every partition on every pump cycle (37 of them at 30 days: 46 ms a claim against 11 ms
# on plain tables, bench retention). Each scan names its table's floor instead, a
# constant no pending row is older than (``relay_floors``, migration 0011), and only the
# partitions from it on are planned.
#
# The other bound is a ceiling, the database's clock plus CEILING_MARGIN, read with the
# floors: the days retention makes ahead hold nothing yet and are not planned either.
#
# The floor is raised by :func:`raise_floors` (every retention pass, hourly and at each
# worker's start) to the oldest pending row, but never past RAISE_CAP before now. A writer
# that makes a row pending lowers it first, in its own transaction, when the row is
# older than LOWER_HORIZON (a fan-out of an old event, a redrive, a recover): it takes
# the floor's row lock, which the raise takes before it looks, so a raise either sees
# the writer's row or runs after the writer has lowered the floor. A writer of a younger
# row needs no lock: it is above any floor a raise can set while it is in flight.

DELIVERIES, EVENTS = "webhook_deliveries", "events"
LOWER_HORIZON = timedelta(hours=1)
# The newest a floor can be: now minus this. Its lead over LOWER_HORIZON (5 hours) is
# how long a writer that took no lock may stay in flight while a raise runs.
RAISE_CAP = timedelta(hours=6)
NO_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)  # a floor row is missing: prune nothing
# The other bound: no row is newer than the database's clock when it was written, so
# one read now plus this margin (longer than any pump transaction) bounds every row the
# transaction can see, and the days ahead that retention makes in advance are not planned.
CEILING_MARGIN = timedelta(minutes=10)


@dataclass
class Floors:
    """The bounds read at the start of a transaction (``created_at``, aware datetimes)."""

    deliveries: datetime = NO_FLOOR
    events: datetime = NO_FLOOR
    ceiling: datetime = datetime(9999, 1, 1, tzinfo=UTC)

    def of_deliveries(self) -> dict[str, datetime]:
        """The ``:floor`` and ``:ceiling`` parameters of a scan of pending deliveries."""
        return {"floor": self.deliveries, "ceiling": self.ceiling}

    def of_events(self) -> dict[str, datetime]:
        """The ``:floor`` and ``:ceiling`` parameters of a scan of events not fanned out."""
        return {"floor": self.events, "ceiling": self.ceiling}


_FLOORS = text("SELECT name, floor, clock_timestamp() + CAST(:margin AS interval) AS ceiling FROM relay_floors")
_LOWER = text("UPDATE relay_floors SET floor = least(floor, :t) WHERE name = :name RETURNING floor")
_LOCK_FLOORS = text("SELECT name FROM relay_floors ORDER BY name FOR UPDATE")
# A second statement after the lock: in READ COMMITTED it takes a new snapshot, so it sees
# the pending rows of every writer that held the lock before.
_RAISE = text(
    """
    UPDATE relay_floors SET floor = least(coalesce(CASE name
        WHEN 'webhook_deliveries' THEN (SELECT min(created_at) FROM webhook_deliveries WHERE status = 'pending')
        WHEN 'events' THEN (SELECT min(created_at) FROM events WHERE fanned_out_at IS NULL) END, 'infinity'),
        now() - CAST(:cap AS interval))
    RETURNING name, floor
    """
)


def floors(session) -> Floors:
    """The current floors and ceiling, read in ``session``'s transaction."""
    rows = session.connection().execute(_FLOORS, {"margin": CEILING_MARGIN}).all()
    if not rows:
        return Floors()
    found = {r.name: r.floor for r in rows}
    return Floors(found.get(DELIVERIES, NO_FLOOR), found.get(EVENTS, NO_FLOOR), rows[0].ceiling)


def lower_floor(session, oldest: datetime | None, current: Floors | None = None) -> None:
    """Make the deliveries' floor at most ``oldest``: call it when rows that old become pending.

    A no-op for rows younger than LOWER_HORIZON. ``current`` (this transaction's floors)
    is lowered too, so the rest of the transaction scans the new rows.
    """
    if oldest is None or oldest >= datetime.now(UTC) - LOWER_HORIZON:
        return
    new = session.connection().execute(_LOWER, {"t": oldest, "name": DELIVERIES}).scalar()
    if current is not None and new is not None:
        current.deliveries = min(current.deliveries, new)


def raise_floors() -> dict[str, datetime]:
    """Set each floor to its table's oldest pending row, at most RAISE_CAP before now; return them.

    Looks at every partition (no floor): a pending row below a floor, however it got
    there, is scanned again after the next pass.
    """
    with unit_of_work() as session:
        conn = session.connection()
        conn.execute(_LOCK_FLOORS)
        return dict(conn.execute(_RAISE, {"cap": RAISE_CAP}).tuples().all())
