"""Exit statuses, relay-agent's own exceptions, and the one stderr line a relay error becomes."""

from __future__ import annotations

from relay.agent.client.errors import RateLimited, RelayConnectionError, RelayError, lease_refused

EXIT_RELAY = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_TIMEOUT = 4


class ConfigMissing(Exception):
    """RELAY_URL / RELAY_API_KEY missing or malformed: exit 3."""


class LocalError(Exception):
    """A problem on this side (state file, input), reported as one line with exit 1."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class OneLineUsage(Exception):
    """A usage error reported as one line (exit 2)."""


class NothingNew(Exception):
    """``wait`` ran out of time with no new message: one stderr line, exit 4."""


# A short hint per common error symbol: what the agent should do next.
HINTS: dict[str, str] = {
    "unauthenticated": "check RELAY_API_KEY: it must be the ah_live_... key the operator printed with "
    "'relay agents create'; it may have been revoked or the agent disabled",
    "forbidden": "a key reads only its own identity's feed",
    "recipient_not_found": "check the handle (local@org, e.g. bob@acme); the operator creates agents with "
    "'relay agents create'",
    "not_a_participant": "only the thread's sender and recipient may read or reply to it; check the task id "
    "and that RELAY_API_KEY is the right agent's key",
    "thread_not_found": "check the task id: 'relay-agent inbox' and 'relay-agent inbox --sent' list yours",
    "thread_terminal": "start a new handoff with relay-agent send",
    "invalid_transition": "see the thread's state with 'relay-agent show TASK_ID': accept, decline and cancel "
    "need pending; complete, fail, release, renew and request-input need accepted (complete, fail and release "
    "also input_required, which the sender's reply ends); completed, cancelled, declined, failed and expired "
    "are final",
    "not_authorized_transition": "the recipient accepts, declines, completes, fails, releases, renews and "
    "requests input on a handoff; only the sender cancels it",
    "state_changed": "someone changed the thread first; check it with 'relay-agent show TASK_ID' and retry",
    "duplicate_idempotency_key": "that --idempotency-key was already used with a different message; use a new key",
    "invalid_intent_payload": "--intent propose_action needs --proposed-description, --target-file and "
    "--rationale; other intents take none of them",
    "teammate_blocked": "the recipient has blocked you; ask its owner",
    "recipient_disabled": "the other agent is disabled; ask the operator to re-enable it (relay agents enable)",
    "invalid_params": "fix the named field and retry",
    "payload_too_large": "send less: split the diff or link to it with --link",
    "identity_not_found": "check the handle",
    "internal_error": "a relay bug: retry later, and quote the request id to the operator",
    "service_unavailable": "the relay's database is unavailable: retry shortly",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _lease_hint(exc: RelayError) -> str:
    """What to do when the relay refused a call's lease token (``state_changed`` on ``lease_token``)."""
    task = getattr(exc, "task_id", None) or "TASK_ID"
    if "no lease_token" in (exc.message or ""):
        return (
            f"the handoff is leased and relay-agent has no lease token for it (another session accepted it): "
            f"pass --lease-token TOKEN (the lease_token its accept answered), or once it is pending again, "
            f"accept it again (relay-agent accept {task} --lease SECONDS)"
        )
    return (
        f"the saved lease token is stale: the lease lapsed, or the handoff was released or accepted again since; "
        f"check it with 'relay-agent show {task}' and accept it again (relay-agent accept {task} --lease SECONDS), "
        "which saves a new token"
    )


def format_error(exc: RelayError, url: str | None = None) -> str:
    """The one stderr line for a relay error: ``error: SYMBOL: message (hint: ...)``."""
    symbol = exc.symbol or "error"
    message = exc.message
    if isinstance(exc, RelayConnectionError):
        reason = _one_line(getattr(exc, "reason", "") or "no answer")
        attempts = f"{exc.attempts} attempt{'' if exc.attempts == 1 else 's'}"
        message = f"cannot reach the relay at {url or 'RELAY_URL'} ({reason}, {attempts})"
        hint = "is RELAY_URL right, and is the relay up? ('curl $RELAY_URL/healthz' should answer)"
    elif isinstance(exc, RateLimited):
        wait = f"{int(exc.retry_after + 0.999)} s" if exc.retry_after is not None else "a minute"
        hint = f"wait {wait} and retry"
    elif lease_refused(exc):
        hint = _lease_hint(exc)
    else:
        hint = HINTS.get(symbol, "")
        fields = [f for f in exc.field_errors() if f not in (message or "")]
        if fields:
            message = f"{message}: {'; '.join(fields)}" if message else "; ".join(fields)
        if symbol in ("internal_error", "service_unavailable") and exc.request_id:
            hint = f"{hint}; request id {exc.request_id}"
    if exc.idempotency_key and symbol in ("connection_error", "service_unavailable", "internal_error", "bad_response"):
        # The send may have gone through: only a retry with the same key is safe.
        hint = f"{hint}; repeat it with --idempotency-key {exc.idempotency_key} so it cannot be sent twice"
    line = f"error: {symbol}: {_one_line(message)}"
    return f"{line} (hint: {hint})" if hint else line
