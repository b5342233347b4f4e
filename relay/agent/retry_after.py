"""The one ``Retry-After`` parser: the agent client reads the relay's, the webhook sender a receiver's.

Standard library only, like the rest of the agent kit (which imports nothing else of
``relay``); the server's ``relay.services.outbound`` imports it from here.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

_SECONDS = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() is also true of "²"


def parse_retry_after(raw: str | None, now: datetime | None = None) -> int | None:
    """The whole seconds a ``Retry-After`` value asks to wait, or None when it says nothing usable.

    Either form of RFC 9110, 10.2.3: delay-seconds (ASCII digits) or an HTTP-date, counted
    from ``now`` (default: this clock), rounded up, and 0 once past. None for an absent,
    empty or unreadable value ("-5", "1.5", "soon"): the caller's own backoff then decides,
    and a header never fails the call it came with.
    """
    value = (raw or "").strip()
    if not value:
        return None
    if _SECONDS.fullmatch(value):
        return int(value)
    try:
        when = parsedate_to_datetime(value)
    except Exception:  # noqa: BLE001 (any unreadable date is "no advice")
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; the obsolete forms may carry no zone
        when = when.replace(tzinfo=UTC)
    return max(0, math.ceil((when - (now or datetime.now(UTC))).total_seconds()))
