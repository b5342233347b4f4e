"""The official ``a2a-sdk`` client, unmodified, against a live relay (gunicorn + Celery worker).

A stock A2A v1.0 client resolves a relay agent's card, hands it
work and follows it to completion while the recipient works through
the relay's JSON-RPC dialect.
Each test drives ``a2a.client`` over real HTTP on loopback; the recipient's side uses
plain ``POST /a2a`` calls, as an agent on that dialect would.
"""

from __future__ import annotations

import json
import uuid

import pytest
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, VersionNotSupportedError
from google.protobuf.json_format import MessageToDict

from tests.a2a_helpers import run, sdk_client, seed
from tests.a2a_helpers import send_text as _send
from tests.receiver import Receiver

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("settled")]


def test_card_round_trip_through_the_seed_dialect(relay_url, make_agent):
    alice, alice_key = make_agent("alice@sdk", name="Alice", role="frontend")
    bob, bob_key = make_agent("bob@sdk", name="Bob", role="backend")

    async def scenario():
        async with sdk_client(relay_url, bob, alice_key) as client:
            assert client._card.name == "Bob"  # the card came from /a2a/agents/bob@sdk/.well-known/agent-card.json
            task = await _send(client, "Refactored /users; please adopt the paginated shape.")
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_SUBMITTED
            assert [m.role for m in got.history] == [Role.ROLE_USER]

            seed(relay_url, bob_key, "tasks/update", {"task_id": task.id, "transition": "accept", "session_id": "s-1"})
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_WORKING

            seed(
                relay_url,
                bob_key,
                "message/send",
                {"task_id": task.id, "message": {"parts": [{"type": "text", "text": "On it; the client is updated."}]}},
            )
            seed(
                relay_url,
                bob_key,
                "tasks/update",
                {"task_id": task.id, "transition": "complete", "result_summary": "Client uses { items, next_cursor }."},
            )
            done = await client.get_task(GetTaskRequest(id=task.id))
            assert done.status.state == TaskState.TASK_STATE_COMPLETED
            assert done.status.message.role == Role.ROLE_AGENT
            assert done.status.message.parts[0].text == "Client uses { items, next_cursor }."
            assert [m.role for m in done.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
            assert done.context_id == task.context_id

    run(scenario())


def test_list_tasks_pages_each_task_once(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@sdk")
    bob, _bob_key = make_agent("bob@sdk")

    async def scenario():
        async with sdk_client(relay_url, bob, alice_key) as client:
            sent = [(await _send(client, f"task {i}")).id for i in range(5)]
            seen, token, pages = [], "", 0
            while True:
                page = await client.list_tasks(ListTasksRequest(page_size=2, page_token=token))
                pages += 1
                assert page.total_size == 5
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            assert pages == 3
            assert seen == list(reversed(sent))  # newest status first, each once

    run(scenario())


def test_cancel_pending_task_then_not_cancelable(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@sdk")
    bob, _bob_key = make_agent("bob@sdk")

    async def scenario():
        async with sdk_client(relay_url, bob, alice_key) as client:
            task = await _send(client, "never mind soon")
            cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError) as info:
                await client.cancel_task(CancelTaskRequest(id=task.id))
            assert info.value.data["symbol"] == "invalid_transition"

    run(scenario())


def test_sdk_raises_its_own_errors(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@sdk")
    bob, _bob_key = make_agent("bob@sdk")

    async def scenario():
        async with sdk_client(relay_url, bob, alice_key) as client:
            with pytest.raises(TaskNotFoundError) as info:
                await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))
            assert info.value.data["symbol"] == "thread_not_found"
        # The factory only sets A2A-Version when the caller has not: an old client says 0.3.
        async with sdk_client(relay_url, bob, alice_key, **{"A2A-Version": "0.3"}) as old:
            with pytest.raises(VersionNotSupportedError):
                await old.get_task(GetTaskRequest(id=str(uuid.uuid4())))

    run(scenario())


def test_push_notification_config_receives_state_change(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@sdk")
    bob, bob_key = make_agent("bob@sdk")

    async def scenario(rx: Receiver):
        async with sdk_client(relay_url, bob, alice_key) as client:
            task = await _send(client, "tell me when you start")
            config = await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, url=rx.url("/a2a-push"), token="tok-8")
            )
            assert config.task_id == task.id and config.token == "tok-8" and config.id
            return task

    with Receiver() as rx:
        task = run(scenario(rx))
        seed(relay_url, bob_key, "tasks/update", {"task_id": task.id, "transition": "accept"})
        [push] = rx.wait_for(1, timeout=30, path="/a2a-push")
        assert push.header("X-A2A-Notification-Token") == "tok-8"
        update = json.loads(push.body)["statusUpdate"]
        assert update["taskId"] == task.id and update["contextId"] == task.context_id
        assert update["status"]["state"] == "TASK_STATE_WORKING"
        # The body parses as the SDK's own StreamResponse.
        from a2a.types.a2a_pb2 import StreamResponse
        from google.protobuf.json_format import ParseDict

        parsed = ParseDict(json.loads(push.body), StreamResponse())
        assert parsed.status_update.status.state == TaskState.TASK_STATE_WORKING
        assert MessageToDict(parsed)["statusUpdate"]["taskId"] == task.id


def test_the_lifecycle_ends_through_the_stock_client(relay_url, make_agent, app):
    """The work lifecycle's ends: declined is REJECTED, failed FAILED, expired CANCELED; ListTasks filters on them."""
    from relay.ids import parse_ulid
    from tests.conftest import sql

    _alice, alice_key = make_agent("alice@sdk")
    bob, bob_key = make_agent("bob@sdk")

    async def scenario():
        async with sdk_client(relay_url, bob, alice_key) as client:
            declined, failed, expired, cancelled = [await _send(client, f"task {i}") for i in range(4)]
            await client.cancel_task(CancelTaskRequest(id=cancelled.id))
            seed(relay_url, bob_key, "tasks/update", {"task_id": declined.id, "transition": "decline", "reason": "no"})
            seed(relay_url, bob_key, "tasks/update", {"task_id": failed.id, "transition": "accept"})
            seed(relay_url, bob_key, "tasks/update", {"task_id": failed.id, "transition": "fail", "reason": "stuck"})
            sql(
                app,
                "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id",
                id=parse_ulid(expired.id),
            )
            states = {
                t.id: (await client.get_task(GetTaskRequest(id=t.id))).status.state for t in (declined, failed, expired)
            }
            for task, reason in ((declined, "no"), (failed, "stuck")):  # why, as the agent's status message
                status = (await client.get_task(GetTaskRequest(id=task.id))).status
                assert (status.message.role, status.message.parts[0].text) == (Role.ROLE_AGENT, reason)
            assert states == {
                declined.id: TaskState.TASK_STATE_REJECTED,
                failed.id: TaskState.TASK_STATE_FAILED,
                expired.id: TaskState.TASK_STATE_CANCELED,
            }
            for state, ids in (
                (TaskState.TASK_STATE_REJECTED, [declined.id]),
                (TaskState.TASK_STATE_FAILED, [failed.id]),
                (TaskState.TASK_STATE_CANCELED, [cancelled.id, expired.id]),  # either end is CANCELED
            ):
                page = await client.list_tasks(ListTasksRequest(status=state))
                assert sorted(t.id for t in page.tasks) == sorted(ids), state

    run(scenario())
