"""One attempt: resolve, check and POST a prepared delivery (no database), and what counts as a success."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from relay.services import outbound
from relay.services.delivery.claims import Claimed
from relay.services.delivery.payloads import Outgoing


@dataclass(frozen=True)
class Result:
    """One attempt's outcome, to record."""

    claimed: Claimed
    attempted_at: datetime
    outcome: outbound.Outcome
    attempt: tuple[int, datetime] | None = None  # its row written before sending; None: insert one


def attempt(prepared: Outgoing, sender: outbound.Sender, targets: outbound.TargetCache, settings) -> Result:
    """Resolve, check and POST one prepared delivery (no database); thread-safe."""
    attempted_at = datetime.now(UTC)
    if prepared.error is not None:
        return Result(prepared.claimed, attempted_at, outbound.Outcome(None, prepared.error, None, 0), prepared.attempt)
    started = datetime.now(UTC)
    try:
        target = targets.resolve(
            prepared.url, allow_private=settings.webhook_allow_private, allow_http=settings.webhook_allow_http
        )
    except outbound.TargetRefused as exc:
        ms = int((datetime.now(UTC) - started).total_seconds() * 1000)
        reason = f"DNS failure: {exc}" if exc.kind == "dns" else f"refused: {exc}"
        return Result(prepared.claimed, attempted_at, outbound.Outcome(None, reason, None, ms), prepared.attempt)
    outcome = sender.post(target, prepared.body, prepared.headers, timeout=settings.webhook_timeout)
    return Result(prepared.claimed, attempted_at, outcome, prepared.attempt)


def _ok(outcome: outbound.Outcome) -> bool:
    return outcome.status is not None and 200 <= outcome.status < 300
