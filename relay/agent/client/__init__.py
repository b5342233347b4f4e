"""A Python client for the handoff relay, speaking only its public HTTP API.

The client needs nothing but the standard library, ``requests`` and
``standardwebhooks``; it never imports the server's services, models or schemas, so it
can be copied into an agent's own code base. (Importing it as ``relay.agent.client`` runs
``relay/__init__.py``, which imports Flask; the client itself does not use it.)

The relay's JSON-RPC 2.0 dialect (``POST /a2a``, docs/api.md)::

    with RelayClient("http://127.0.0.1:8000", "ah_live_...") as bob:
        sent = bob.send("frank@acme", "Refactored /users; new shape {items, next_cursor}")
        ...
    with RelayClient("http://127.0.0.1:8000", "ah_live_...") as frank:
        for task in frank.inbox(status=["pending"]).items:
            handoff = frank.get(task.task_id)          # marks it read
            frank.accept(task.task_id, session_id="s-1")
            frank.reply(task.task_id, "on it")
            frank.complete(task.task_id, "client updated")

The messages feed (``GET /api/v1/identities/{handle}/a2a/messages``, docs/api.md):
:meth:`RelayClient.messages`, :meth:`RelayClient.search` and
:meth:`RelayClient.catch_up` (the feed's recovery loop after downtime).

Waking an agent that has no public URL (no webhook receiver): :meth:`RelayClient.wait`
long-polls the feed until a message arrives after a position, and
:meth:`RelayClient.stream` reads the feed's Server-Sent Events stream
(``.../a2a/messages/stream``), reconnecting with ``Last-Event-ID`` after a drop::

    with RelayClient(url, key) as bob:
        rows = bob.wait(after=last_id, timeout=300)        # [] when nothing came in 300 s
        for row in bob.stream(after=last_id):              # runs until an error is raised
            last_id = row.id

Errors: every failure the relay answers raises a subclass of :class:`RelayError`, one
per error symbol (``ThreadNotFound`` for ``thread_not_found``, ...), for both
transports. Transient failures (dropped connections, timeouts, HTTP 5xx, HTTP 429) are
retried with exponential backoff; a refused connection (nothing listens at the URL) and
domain errors are not. See :class:`RelayClient`.

Webhooks: :func:`verify_webhook` checks a delivery's Standard Webhooks signature.

Modules, one concern each: ``relay_client`` (:class:`RelayClient`), ``transport`` (HTTP,
retries, answers to errors), ``handoffs`` (JSON-RPC), ``identities``, ``feed`` (REST feed,
long-poll), ``streams`` (SSE), ``models`` (results), ``errors``, ``webhooks``. Import their
public names from ``relay.agent.client``: ``__all__``, and beside it ``ConfigurationError``,
``check_settings``, ``transport_reason`` and ``MAX_WAIT_SECONDS``.
"""

from __future__ import annotations

from relay.agent.client.errors import (
    ERROR_SYMBOLS,
    AgentExists,
    BadResponse,
    ContentTypeNotSupported,
    DuplicateIdempotencyKey,
    Forbidden,
    HeadersTooLarge,
    IdentityNotFound,
    InternalError,
    InvalidIntentPayload,
    InvalidParams,
    InvalidRequest,
    InvalidTransition,
    KeyNotFound,
    MethodNotAllowed,
    MethodNotFound,
    NotAParticipant,
    NotAuthorizedTransition,
    NotFound,
    ParseError,
    PayloadTooLarge,
    RateLimited,
    RecipientDisabled,
    RecipientNotFound,
    RelayConnectionError,
    RelayError,
    RequestLineTooLong,
    RequestTimeout,
    ServiceUnavailable,
    StateChanged,
    StreamUnavailable,
    TeammateBlocked,
    ThreadNotFound,
    ThreadTerminal,
    Unauthenticated,
    UnsupportedOperation,
    VersionNotSupported,
    WebhookVerificationError,
    error_class,
    lease_refused,
)
from relay.agent.client.errors import ConfigurationError as ConfigurationError
from relay.agent.client.feed import MAX_WAIT_SECONDS as MAX_WAIT_SECONDS
from relay.agent.client.feed import next_position
from relay.agent.client.models import (
    AgentRef,
    FeedRow,
    Handoff,
    Identity,
    Message,
    Page,
    SendResult,
    TaskSummary,
    TransitionResult,
)
from relay.agent.client.relay_client import RelayClient
from relay.agent.client.streams import SSEParser
from relay.agent.client.transport import RetryNotice
from relay.agent.client.transport import check_settings as check_settings
from relay.agent.client.transport import transport_reason as transport_reason
from relay.agent.client.webhooks import verify_webhook

__all__ = [
    "RelayClient",
    "RetryNotice",
    "verify_webhook",
    # results
    "AgentRef",
    "Identity",
    "Message",
    "Handoff",
    "TaskSummary",
    "SendResult",
    "TransitionResult",
    "FeedRow",
    "Page",
    "next_position",
    "SSEParser",
    # errors
    "RelayError",
    "RelayConnectionError",
    "BadResponse",
    "StreamUnavailable",
    "WebhookVerificationError",
    "ERROR_SYMBOLS",
    "error_class",
    "ParseError",
    "InvalidRequest",
    "PayloadTooLarge",
    "MethodNotFound",
    "InvalidParams",
    "InternalError",
    "Unauthenticated",
    "Forbidden",
    "RateLimited",
    "RecipientNotFound",
    "RecipientDisabled",
    "NotAParticipant",
    "ThreadNotFound",
    "ThreadTerminal",
    "InvalidTransition",
    "NotAuthorizedTransition",
    "StateChanged",
    "lease_refused",
    "DuplicateIdempotencyKey",
    "InvalidIntentPayload",
    "TeammateBlocked",
    "IdentityNotFound",
    "AgentExists",
    "KeyNotFound",
    "NotFound",
    "ServiceUnavailable",
    "UnsupportedOperation",
    "VersionNotSupported",
    "MethodNotAllowed",
    "RequestTimeout",
    "RequestLineTooLong",
    "HeadersTooLarge",
    "ContentTypeNotSupported",
]
