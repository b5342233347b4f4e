"""message/send: a create or an append, run once per idempotency key."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from relay.models import Agent
from relay.services import idempotency
from relay.services.threads.append import _append
from relay.services.threads.create import _create


def send_message(
    caller: Agent,
    params: dict,
    *,
    peer: Agent | None = None,
    adopt_context: bool = False,
    then: Callable[[Session, dict], None] | None = None,
) -> dict:
    """Create a handoff (``task_id`` null) or append to one (``message/send``, docs/api.md).

    Create raises invalid_params (recipient missing, yourself, unknown context_id),
    recipient_not_found, invalid_intent_payload, teammate_blocked. Append raises
    thread_not_found, not_a_participant, thread_terminal. Either raises
    duplicate_idempotency_key when ``metadata.client_idempotency_key`` was used with
    other params.

    The A2A binding passes ``peer`` (appends only to threads the caller sent to that
    agent), ``adopt_context`` (a ``context_id`` nobody uses yet starts a new context with
    that id, A2A's client-chosen contextId), ``params["expect_context_id"]`` (an append
    whose thread is in another context is invalid_params) and ``then(session, result)``,
    run in the same transaction after a first (not replayed) send.
    """
    key = (params.get("metadata") or {}).get("client_idempotency_key")

    def work(session: Session) -> dict:
        if params.get("task_id") is None:
            # Alone in its use case (no key to record, nothing run after it): no BEGIN/COMMIT.
            alone = key is None and then is None
            result = _create(session, caller, params, adopt_context=adopt_context, own_transaction=alone)
        else:
            result = _append(session, caller, params, peer=peer)
        if then is not None:
            then(session, result)
        return result

    return idempotency.run_once(caller, key, "message/send", params, work)
