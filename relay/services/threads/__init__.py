"""Handoff threads: create, append, read, list and transition (docs/api.md, "JSON-RPC: `POST /a2a`").

Each public function is one use case and one transaction. Callers pass loaded params
(see relay.schemas.handoffs); results are plain dicts ready for any transport.

One module per use case: ``send`` (message/send, over ``create`` and ``append``),
``read`` (tasks/get, the audit trail), ``listing`` (tasks/list), ``transitions``
(tasks/update, tasks/cancel) and ``clock`` (lapsed leases and expiries). What they share
is in ``rules`` (the state machine) and ``common``. The use cases and their public names
are re-exported here: the transports call ``threads.send_message`` and the like.
"""

from __future__ import annotations

from relay.services.threads.append import CREATE_ONLY
from relay.services.threads.clock import SWEEP_BATCH, settle, settle_due
from relay.services.threads.common import feed_lock_keys_sql, load_thread
from relay.services.threads.listing import PREVIEW_CHARS, list_threads, thread_summary
from relay.services.threads.read import MAX_MESSAGES_PAGE, audit_trail, get_thread, message_row
from relay.services.threads.rules import (
    ALSO_FROM,
    EXPIRED,
    FENCED,
    INPUT_PROVIDED,
    LEASE_EXPIRED,
    REASON_REQUIRED,
    STAMP_COLUMN,
    TRANSITIONS,
)
from relay.services.threads.send import send_message
from relay.services.threads.transitions import transition

__all__ = [
    "ALSO_FROM",
    "CREATE_ONLY",
    "EXPIRED",
    "FENCED",
    "INPUT_PROVIDED",
    "LEASE_EXPIRED",
    "MAX_MESSAGES_PAGE",
    "PREVIEW_CHARS",
    "REASON_REQUIRED",
    "STAMP_COLUMN",
    "SWEEP_BATCH",
    "TRANSITIONS",
    "audit_trail",
    "feed_lock_keys_sql",
    "get_thread",
    "list_threads",
    "load_thread",
    "message_row",
    "send_message",
    "settle",
    "settle_due",
    "thread_summary",
    "transition",
]
