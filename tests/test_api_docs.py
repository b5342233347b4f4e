"""docs/api.md's field tables name exactly the fields the answers hold.

Each table's first column names fields in backticks (``| `task_id`, `thread_id` | ...``);
the test reads the table and compares its names with the keys of a real answer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import bearer, rpc

API_MD = Path(__file__).resolve().parent.parent / "docs" / "api.md"
CELL_NAME = re.compile(r"`([a-z_0-9]+)`")


def documented(heading: str, nth: int = 0) -> set[str]:
    """The field names of the ``nth`` table under the heading ``heading`` (up to the next heading)."""
    lines = API_MD.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.fullmatch(r"#+ " + re.escape(heading), line))
    tables: list[list[str]] = []
    previous = ""
    for line in lines[start + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    rows = tables[nth][1:]  # past the header row
    return {name for row in rows for name in CELL_NAME.findall(row.split("|")[1])}


@pytest.fixture
def handoff(client, alice, bob):
    """A create (with priority and expiry) and a reply; returns (create answer, reply answer, task id)."""
    made = rpc(
        client,
        alice[1],
        "message/send",
        {
            "recipient": bob[0],
            "message": {"parts": [{"type": "text", "text": "please"}]},
            "priority": "high",
            "expires_in_seconds": 600,
        },
    )
    reply = rpc(
        client,
        bob[1],
        "message/send",
        {"task_id": made["task_id"], "message": {"parts": [{"type": "text", "text": "on it"}]}},
    )
    return made, reply, made["task_id"]


def test_the_send_result_table_names_the_create_and_append_fields(handoff):
    made, reply, _task_id = handoff
    assert documented("Send result") == set(made) | set(reply)


def test_the_thread_and_message_tables_name_the_fields_of_tasks_get(client, bob, handoff):
    _made, _reply, task_id = handoff
    page = rpc(client, bob[1], "tasks/get", {"task_id": task_id, "messages_limit": 10})
    assert documented("Thread") == set(page)
    # a2a_message_id is only on messages sent over the A2A binding.
    assert documented("Thread", 1) == {k for m in page["messages"] for k in m} | {"a2a_message_id"}


def test_the_thread_list_table_names_the_fields_of_a_list_item(client, bob, handoff):
    [item] = rpc(client, bob[1], "tasks/list", {})["items"]
    assert documented("Thread list") == set(item)


def test_the_feed_row_table_names_the_fields_of_a_feed_row(client, bob, handoff):
    rows = client.get(f"/api/v1/identities/{bob[0]}/a2a/messages", headers=bearer(bob[1])).get_json()["items"]
    assert documented("The messages feed", 1) == {k for row in rows for k in row}


def test_the_feed_parameter_table_names_the_feeds_query_parameters():
    from relay.schemas.rest import FeedQuery

    assert documented("The messages feed", 0) == set(FeedQuery().fields)
