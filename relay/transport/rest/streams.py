"""``GET /api/v1/identities/{handle}/a2a/messages/stream``: the feed as Server-Sent Events
(docs/decisions.md, "Waking agents").

Each committed message matching the feed's filters is one event, oldest first::

    event: message
    id: <message id>
    data: <the feed row, as GET .../a2a/messages returns it>

A comment (``: heartbeat``) goes out every ``RELAY_STREAM_HEARTBEAT`` seconds. A client
that reconnects with ``Last-Event-ID`` (or ``after``) resumes after that message, with
nothing skipped and nothing repeated (the feed's catch-up rule); without either, and
without ``since``, it starts at the newest message. When the key is revoked or the agent
disabled, or the stream fails (``internal_error`` or ``service_unavailable``, with the
request id in the log), a last ``event: error`` carries the problem and the stream ends.
"""

from __future__ import annotations

import uuid

from flask import Response, request, stream_with_context

from relay.encoding import dumps_bytes
from relay.errors import RelayError, invalid
from relay.schemas.rest import StreamQuery
from relay.services import streams
from relay.transport import disconnect, errors
from relay.transport.rest import bp, identity, load_query, still_allowed

# How long an EventSource waits before reconnecting, in milliseconds (the SSE "retry" field).
RECONNECT_MS = 2000

_STREAM_QUERY = StreamQuery()  # schemas hold no request state: built once, not per request


def _last_event_id() -> uuid.UUID | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or not raw.strip():
        return None
    try:
        return uuid.UUID(raw.strip())
    except ValueError:
        raise invalid("Last-Event-ID", "is not a message id sent by this stream") from None


def _event(item) -> bytes:
    if item is streams.HEARTBEAT:
        return b": heartbeat\n\n"
    if isinstance(item, RelayError):
        return b"event: error\ndata: " + dumps_bytes({"code": item.symbol, "message": item.message}) + b"\n\n"
    event_id, row = item
    # The row is one JSON line: orjson escapes newlines inside strings, so no data line breaks.
    return b"event: message\nid: " + event_id.encode() + b"\ndata: " + dumps_bytes(row) + b"\n\n"


@bp.get("/identities/<handle>/a2a/messages/stream")
def stream_messages(handle: str):
    """Stream the identity's new messages as ``text/event-stream`` (feed filters; no cursor, no limit)."""
    caller = identity(handle)
    params = load_query(_STREAM_QUERY)
    resume = _last_event_id()
    if resume is not None:  # the reconnecting client's position wins over the URL's
        params["after"], field = resume, "Last-Event-ID"
    else:
        field = "after"
    opened = streams.open_stream(
        caller,
        still_allowed=still_allowed(handle),
        after_field=field,
        client_gone=disconnect.probe(request.environ),
        **params,
    )

    def body():
        # Sent once the starting position is taken: from here on nothing is missed.
        yield f"retry: {RECONNECT_MS}\n: ready\n\n".encode()
        try:
            for item in opened.events():
                yield _event(item)
        except Exception as exc:  # the 200 is sent: a last error event, not a cut connection
            yield _event(errors.unexpected(exc))

    response = Response(
        stream_with_context(body()),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    # Also when the body never started (the client left first): the slot and the waiter go back.
    response.call_on_close(opened.close)
    return response
