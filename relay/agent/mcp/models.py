"""The tools' arguments and answers as pydantic models: the schemas ``tools/list`` shows.

Every argument model forbids unknown members; an optional argument's schema has its
JSON type at the top (``core.input_schema``), so clients that convert strings by type
(the MCP Inspector's CLI) can give ``sequence_no=1`` or ``status=["pending"]``. Answer
models describe what each tool returns; they allow further members (the relay adds
fields over time) and name the ``cut`` notes of the budgeted serializer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: wait_for_messages's bounds on timeout_seconds
WAIT_MIN_SECONDS, WAIT_MAX_SECONDS = 1, 600
#: get_thread's default page: the newest this many messages
THREAD_PAGE = 50

States = Literal["pending", "accepted", "input_required", "completed", "cancelled", "declined", "failed", "expired"]
Priorities = Literal["low", "normal", "high", "urgent"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileDiff(_Strict):
    """A change to one file, as a unified diff."""

    type: Literal["file_diff"]
    path: str = Field(description="Repository-relative path of the file, e.g. 'src/api/users.py'.")
    diff: str = Field(description="Unified diff of the change ('@@ -1,5 +1,8 @@ ...').")


class FileRef(_Strict):
    """A pointer to a file (optionally a line range) the recipient should look at."""

    type: Literal["file_ref"]
    path: str = Field(description="Repository-relative path of the file.")
    line_start: int | None = Field(None, ge=1, description="First line of interest (1-based).")
    line_end: int | None = Field(None, ge=1, description="Last line of interest; not before line_start.")
    ref: str | None = Field(None, description="Git ref (branch, tag or commit) the path refers to.")
    description: str | None = Field(None, description="What to look at there.")


class TestCommand(_Strict):
    """A shell command that checks the work, e.g. the test to run."""

    __test__ = False  # not a pytest class
    type: Literal["test_command"]
    command: str = Field(description="The command line, e.g. 'pytest tests/test_users.py -q'.")
    cwd: str | None = Field(None, description="Directory to run it in, relative to the repository root.")
    description: str | None = Field(None, description="What passing means.")


class ApiContract(_Strict):
    """An API shape both sides must agree on."""

    type: Literal["api_contract"]
    name: str = Field(description="Name of the API or endpoint, e.g. 'GET /users'.")
    spec: str | dict[str, Any] = Field(
        description="The contract: text (OpenAPI YAML, a type signature...) "
        "or a JSON object (a JSON Schema, an OpenAPI fragment...)."
    )
    format: str | None = Field(None, description="Format of spec, e.g. 'openapi', 'jsonschema', 'typescript'.")


class Link(_Strict):
    """A URL (issue, pull request, document) relevant to the handoff."""

    type: Literal["link"]
    url: str = Field(description="http(s) URL.")
    title: str | None = Field(None, description="Short title of the page.")
    mediaType: str | None = Field(  # noqa: N815 (the artifact's own spelling, as the API takes it)
        None, description="Media type of what the URL names, e.g. 'text/plain' (at most 127 characters)."
    )


Artifact = Annotated[FileDiff | FileRef | TestCommand | ApiContract | Link, Field(discriminator="type")]


class ProposedAction(_Strict):
    """The change the sender proposes the recipient make (required with intent 'propose_action')."""

    description: str = Field(description="Human-readable summary of the proposed change.")
    target_files: list[str] = Field(min_length=1, description="Paths the recipient's agent will touch.")
    rationale: str = Field(description="Why this change is needed.")
    suggested_diff: str | None = Field(None, description="Optional unified diff; the recipient may draft its own.")


TaskId = Annotated[
    str,
    Field(
        description="The handoff's task_id: the 26-character ULID returned by send_handoff "
        "and shown by list_inbox, e.g. '01HXYZ4K2VNJQP7R8MWDB3CSTF'."
    ),
]
ArtifactList = Annotated[
    list[Artifact] | None,
    Field(
        description="Optional structured attachments (at most 50), each an object with a 'type': "
        "file_diff {path, diff}; file_ref {path, line_start?, line_end?, ref?, description?}; "
        "test_command {command, cwd?, description?}; api_contract {name, spec, format?}; "
        "link {url, title?}."
    ),
]
LeaseSeconds = Annotated[
    int | None,
    Field(
        ge=10,
        le=86_400,
        description="Optional: lease the work for this many seconds (10-86400); past the lease's end "
        "(without renew) the handoff is pending again. Leave it out for no lease.",
    ),
]
LeaseToken = Annotated[
    str | None,
    Field(
        max_length=64,
        description="The lease_token of a leased handoff; leave it out to send the one this server "
        "remembers from its accept (or renew).",
    ),
]
Reason = Annotated[
    str,
    Field(min_length=1, max_length=2000, description="Why, for the sender to read (1-2000 characters)."),
]
IdempotencyKey = Annotated[
    str | None,
    Field(
        description="Optional key (up to 255 characters, e.g. a UUID; not starting with 'a2a:') that makes "
        "the call safe to repeat: "
        "calling again with the same key and the same arguments returns the first result "
        "instead of sending twice. Leave it out and one is generated (returned as idempotency_key)."
    ),
]


# =========================================================================== each tool's arguments

Recipient = Annotated[str, Field(description="Handle of the agent to hand the work to, 'local@org', e.g. 'bob@acme'.")]


class SendHandoffInput(_Strict):
    recipient: Recipient
    text: str = Field(
        description="The brief: what you did, what you need and anything the recipient must know (plain text or Markdown)."
    )
    intent: Literal["inform", "ask_question", "propose_action"] = Field(
        "inform",
        description="'inform' (an FYI or a task to take over), 'ask_question' (you need an answer) or "
        "'propose_action' (you propose a change; then proposed_action is required).",
    )
    artifacts: ArtifactList = None
    proposed_action: ProposedAction | None = Field(
        None,
        description="Required with intent 'propose_action', and must be left out otherwise: "
        "{description, target_files, rationale, suggested_diff?}.",
    )
    context_id: str | None = Field(
        None,
        description="Optional context_id (ULID) of one of your earlier handoffs, to group this one with it; "
        "leave it out to start a new context.",
    )
    idempotency_key: IdempotencyKey = None
    priority: Priorities | None = Field(
        None, description="Optional priority: 'low', 'normal' (the default), 'high' or 'urgent'."
    )
    expires_in_seconds: int | None = Field(
        None,
        ge=10,
        le=2_592_000,
        description="Optional: if still pending after this many seconds (10-2592000), the handoff becomes expired (final).",
    )


class ReplyInput(_Strict):
    task_id: TaskId
    text: str = Field(description="The message to add to the thread.")
    artifacts: ArtifactList = None
    idempotency_key: IdempotencyKey = None


class ListInboxInput(_Strict):
    status: list[States] | None = Field(
        None, description="Only threads in these states, e.g. ['pending'] for new work; leave it out for all."
    )
    priority: list[Priorities] | None = Field(
        None, description="Only threads of these priorities, e.g. ['urgent', 'high']; leave it out for all."
    )
    sent: bool = Field(
        False, description="false (default): handoffs addressed to you (your inbox); true: handoffs you opened."
    )
    limit: int = Field(20, ge=1, le=200, description="At most this many threads (1-200).")
    since: str | None = Field(
        None,
        description="Only threads with activity at or after this ISO 8601 time with a timezone, e.g. '2026-04-25T10:00:00Z'.",
    )
    cursor: str | None = Field(None, description="next_cursor from a previous call, for the next page.")


class GetThreadInput(_Strict):
    task_id: TaskId
    messages_limit: int = Field(
        THREAD_PAGE, ge=1, le=1000, description="How many messages at most (1-1000; default the newest 50)."
    )
    messages_after: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="Read the messages after this sequence_no, oldest first (0: from the start); "
        "leave it out for the newest messages_limit.",
    )


class ReadArtifactInput(_Strict):
    task_id: TaskId
    sequence_no: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="The message's sequence_no; leave it out for a field of the thread itself (summary...).",
    )
    index: int | None = Field(
        None, ge=0, le=99, description="Which of the message's artifacts (0 first); leave it out for the body."
    )
    field: str | None = Field(
        None,
        max_length=2000,
        description="What to read, as a cut note's field names it: 'artifacts[0].spec', 'payload.notes', "
        "'summary' (with no sequence_no); relative to the artifact when index is given.",
    )
    offset: int = Field(0, ge=0, le=2**31 - 1, description="Where to start, in characters (0: the start).")


class AcceptInput(_Strict):
    task_id: TaskId
    session_id: str | None = Field(
        None, description="Optional id of your working session, recorded in the audit trail (up to 255 characters)."
    )
    lease_seconds: LeaseSeconds = None


class CompleteInput(_Strict):
    task_id: TaskId
    result_summary: str = Field(
        description="What was done and where (commits, files, test results), for the sender to read; "
        "up to 8192 characters."
    )
    lease_token: LeaseToken = None


class TaskInput(_Strict):
    task_id: TaskId


class DeclineInput(_Strict):
    task_id: TaskId
    reason: Reason


class FailInput(_Strict):
    task_id: TaskId
    reason: Reason
    lease_token: LeaseToken = None


class RequestInputInput(_Strict):
    task_id: TaskId
    question: str = Field(
        min_length=1, max_length=2000, description="What you need the sender to answer (1-2000 characters)."
    )
    lease_token: LeaseToken = None


class ReleaseInput(_Strict):
    task_id: TaskId
    reason: str | None = Field(
        None, min_length=1, max_length=2000, description="Optional: why you give it back (1-2000 characters)."
    )
    lease_token: LeaseToken = None


class RenewInput(_Strict):
    task_id: TaskId
    lease_seconds: int | None = Field(
        None,
        ge=10,
        le=86_400,
        description="The lease runs this many seconds (10-86400) from now; default the accept's length. "
        "Needed for a handoff accepted without a lease (renew then starts one).",
    )
    lease_token: LeaseToken = None


class SearchMessagesInput(_Strict):
    query: str = Field(
        min_length=1,
        max_length=500,
        description='Full-text search (1-500 characters), web-search syntax: words, "exact phrase", -excluded, a or b.',
    )
    limit: int = Field(20, ge=1, le=100, description="At most this many messages (1-100).")


class CatchUpInput(_Strict):
    since: str = Field(
        description="ISO 8601 time with a timezone, e.g. '2026-04-25T10:00:00Z': every message created at or "
        "after it is returned."
    )
    limit: int = Field(200, ge=1, le=1000, description="At most this many messages (1-1000), the oldest first.")
    direction: Literal["inbound", "outbound", "both"] = Field(
        "both", description="'inbound': threads sent to you; 'outbound': threads you opened; 'both' (default)."
    )
    seen_ids: list[str] | None = Field(
        None,
        description="Message ids you already processed (since is inclusive, so the messages at exactly that "
        "time come back): they are left out.",
    )


class WaitInput(_Strict):
    timeout_seconds: int = Field(
        60,
        ge=WAIT_MIN_SECONDS,
        le=WAIT_MAX_SECONDS,
        description=f"How long to wait at most, in whole seconds ({WAIT_MIN_SECONDS}-{WAIT_MAX_SECONDS}).",
    )
    after: str | None = Field(
        None,
        max_length=64,
        description="Optional: wait for messages after this message id (next_after of the previous call). "
        "Leave it out to go on from where this server's last call stopped (relay-mcp), or from now (the relay's /mcp).",
    )


# =========================================================================== each tool's answer


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class CutNote(BaseModel):
    """Where a cut value goes on: read_artifact's call for the rest."""

    field: str
    shown: int = Field(description="Characters shown.")
    total: int = Field(description="Characters of the whole value.")
    rest: str = Field(description="The read_artifact call that returns what follows.")
    json_text: bool | None = Field(None, alias="json", description="True: the value is shown as its JSON text.")


Cuts = Annotated[list[CutNote] | None, Field(description="What was cut to fit, and where it goes on.")]


class ThreadAnswer(_Open):
    """A thread (handoff) as the relay answers it; send_handoff and reply add their idempotency_key."""

    task_id: str
    status: Any = Field(None, description="{state: pending | accepted | completed | ...}.")
    cut: Cuts = None


class MessageRow(_Open):
    id: Any = None
    task_id: Any = None
    sequence_no: Any = None
    body: Any = None
    cut: Cuts = None


class ThreadPage(ThreadAnswer):
    messages: list[MessageRow] = Field(description="The page's messages, oldest first.")
    note: str | None = Field(None, description="Set when the oldest messages were left out to fit.")


class InboxAnswer(_Open):
    items: list[dict[str, Any]] = Field(description="Threads, newest activity first, without their messages.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last page.")


class ArtifactChunk(_Open):
    task_id: str
    sequence_no: int | None
    index: int | None
    field: str
    offset: int
    text: str = Field(description="At most 50,000 characters from offset.")
    total: int = Field(description="Characters of the whole value.")
    next_offset: int | None = Field(description="Where the next call starts; null at the end.")
    json_text: bool = Field(alias="json", description="True: the value is read as its JSON text.")


class SearchAnswer(_Open):
    items: list[MessageRow]
    more: bool


class CatchUpAnswer(_Open):
    messages: list[MessageRow]
    count: int
    more: bool
    next_since: Any = None
    next_seen_ids: Any = None


class WaitAnswer(_Open):
    messages: list[MessageRow]
    count: int
    timed_out: bool
    next_after: str | None = Field(
        None, description="The position to pass as after to the next call (null: the feed is empty)."
    )
