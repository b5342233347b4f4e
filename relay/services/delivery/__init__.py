"""The webhook delivery pipeline, in batches: fan out, claim under caps, prepare, attempt, record.

docs/webhooks.md, "Delivery" (per-endpoint concurrency
cap and circuit breaker; a slow or dead endpoint delays only itself). The worker's pump
(``workers/delivery.py``) drives these steps for many deliveries at once; ``webhooks.deliver``
drives them for one.

Rules kept here:

- One delivery per (event, endpoint); ``webhook-id`` is the event's id on every attempt.
- A claim leases the delivery (``leased_until`` and ``next_attempt_at`` = now + timeout
  + 30 s) to the claiming pump (``claimed_by``): nobody else sends it meanwhile. Each pump
  heartbeats (``relay_workers``, every ``RELAY_WORKER_HEARTBEAT`` s); a pump silent for
  ``RELAY_WORKER_STALE`` s is dead, and the first live pump to notice makes its claims due
  at once (:func:`heartbeat`). The lease running out is the backstop when no pump is
  left alive (at least once, never lost).
- Every attempt is in the delivery log, even one whose worker died mid-send: its
  ``webhook_attempts`` row is written when it is prepared (``IN_FLIGHT``), before the POST,
  and completed with the outcome when it is recorded; a dead pump's rows say
  ``OUTCOME_UNKNOWN``.
- Caps, counted over the leases of every process (claims are serialised by one advisory
  lock, so two workers cannot both see a free slot): at most
  ``RELAY_WEBHOOK_ENDPOINT_CONCURRENCY`` attempts in flight per endpoint and
  ``RELAY_WEBHOOK_ORG_CONCURRENCY`` per org (the org of the endpoint's agent), of which at
  most half go to the org's unproven endpoints (never attempted, failing, paused, slow
  last time, or with an attempt out for ``RELAY_WEBHOOK_SLOW_MS``): an org's slow
  endpoints cannot take its fast ones' slots, nor one org all of the pump's. A delivery
  beyond a cap stays due and is claimed when one of its endpoint's attempts ends: an
  endpoint queues only behind itself.
- Circuit breaker: after ``RELAY_WEBHOOK_CIRCUIT_FAILURES`` failed attempts in a row the
  endpoint is paused for ``RELAY_WEBHOOK_CIRCUIT_OPEN`` s, doubling each time it opens
  again (at most an hour). Its deliveries stay pending and due; when the pause ends one
  attempt goes out as a probe, and a success closes the circuit.
- Success is any 2xx; 410 disables the endpoint; other failures retry on
  ``RELAY_WEBHOOK_SCHEDULE`` (or later, if the receiver sent ``Retry-After``); an
  endpoint failing for ``RELAY_WEBHOOK_DISABLE_AFTER`` s is disabled with the reason.

One module per step: ``fanout``, ``claims`` (leases and caps), ``payloads`` (prepare),
``attempts`` (the POST), ``records`` (outcomes, retries), ``circuit`` (endpoint health),
``pump`` (the pump's round and heartbeats), over ``bounds`` (the pending floors) and
``common``. The steps' public names are re-exported here.
"""

from __future__ import annotations

from relay.services.delivery.attempts import Result, attempt
from relay.services.delivery.bounds import (
    CEILING_MARGIN,
    DELIVERIES,
    EVENTS,
    LOWER_HORIZON,
    NO_FLOOR,
    RAISE_CAP,
    Floors,
    floors,
    lower_floor,
    raise_floors,
)
from relay.services.delivery.circuit import MAX_CIRCUIT_OPEN, health
from relay.services.delivery.claims import Claimed, claim, endpoints_with_due
from relay.services.delivery.common import HELD, IN_FLIGHT, OUTCOME_UNKNOWN, TEST_EVENT, event_id_text
from relay.services.delivery.fanout import POLL_PENDING_AGE, POLL_PENDING_LIMIT, fan_out_many, pending_events
from relay.services.delivery.payloads import Outgoing, prepare
from relay.services.delivery.pump import cycle, heartbeat, leave
from relay.services.delivery.records import record

__all__ = [
    "CEILING_MARGIN",
    "DELIVERIES",
    "EVENTS",
    "HELD",
    "IN_FLIGHT",
    "LOWER_HORIZON",
    "MAX_CIRCUIT_OPEN",
    "NO_FLOOR",
    "OUTCOME_UNKNOWN",
    "POLL_PENDING_AGE",
    "POLL_PENDING_LIMIT",
    "RAISE_CAP",
    "TEST_EVENT",
    "Claimed",
    "Floors",
    "Outgoing",
    "Result",
    "attempt",
    "claim",
    "cycle",
    "endpoints_with_due",
    "event_id_text",
    "fan_out_many",
    "floors",
    "health",
    "heartbeat",
    "leave",
    "lower_floor",
    "pending_events",
    "prepare",
    "raise_floors",
    "record",
]
