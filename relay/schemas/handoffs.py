"""Load schemas for handoff requests (``POST /a2a``, docs/api.md) and dump helpers for their responses.

Every object of a request is closed: ``message``, each of its ``parts``, each artifact
(by its ``type``), ``proposed_action``, a list's ``filter`` and ``page``; a member none
of them names is invalid_params naming its path (``message.parts.0.colour``). Two
values are open, as the contract defines them: ``metadata`` (freeform) and an
``api_contract`` artifact's ``spec`` (an API description of any shape).
"""

from __future__ import annotations

import json
import re

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from relay.models import INTENTS, PRIORITIES, RESERVED_KEY_PREFIX, THREAD_STATES
from relay.schemas.common import AwareDateTime, BoundedList, Cursor, StrictSchema, Ulid, WebUrl

# Bounds: every size is bounded, and an error over a bound names the bound.
MAX_PARTS = 20
MAX_TEXT = 262_144
MAX_ARTIFACTS = 50
MAX_DIFF = 524_288
MAX_PATH = 4096
MAX_SHORT = 8192
MAX_URL = 2048
MAX_METADATA_BYTES = 16_384
MAX_IDEMPOTENCY_KEY = 255
MAX_LINE = 100_000_000
MAX_TARGET_FILES = 200
MAX_STATUS_FILTER = 20  # states in one tasks/list filter (there are 8; repeats are harmless)
MAX_REASON = 2000
MAX_QUESTION = 2000
# Which params each transition takes, and which of them it requires (1-2000 characters for
# reason and question). A param of another transition is refused naming it, never dropped;
# a null is as absent. The transition names are this table's keys.
TRANSITION_PARAMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "accept": (frozenset({"session_id", "lease_seconds"}), frozenset()),
    "complete": (frozenset({"result_summary", "lease_token"}), frozenset()),
    "cancel": (frozenset(), frozenset()),
    "decline": (frozenset({"reason"}), frozenset({"reason"})),
    "fail": (frozenset({"reason", "lease_token"}), frozenset({"reason"})),
    "release": (frozenset({"reason", "lease_token"}), frozenset()),
    "renew": (frozenset({"lease_seconds", "lease_token"}), frozenset()),
    "request_input": (frozenset({"question", "lease_token"}), frozenset({"question"})),
}
TRANSITIONS = tuple(TRANSITION_PARAMS)
TRANSITION_PARAM_NAMES = ("session_id", "result_summary", "reason", "lease_seconds", "lease_token", "question")
LEASE_RANGE = validate.Range(min=10, max=86_400, error="must be 10-86400 seconds")
EXPIRY_RANGE = validate.Range(min=10, max=2_592_000, error="must be 10-2592000 seconds (30 days)")
PRIORITY_CHOICE = validate.OneOf(PRIORITIES, error=f"must be one of {', '.join(PRIORITIES)}")


def _text(max_len: int, required: bool = True, **kw) -> fields.String:
    return fields.String(
        required=required,
        validate=validate.Length(
            min=1 if required else 0, max=max_len, error=f"must be {1 if required else 0}-{max_len} characters"
        ),
        **kw,
    )


class TextPart(StrictSchema):
    type = fields.String(required=True, validate=validate.Equal("text", error="only text parts are supported"))
    text = fields.String(
        required=True, validate=validate.Length(max=MAX_TEXT, error=f"must be at most {MAX_TEXT} characters")
    )


class MessageIn(StrictSchema):
    """``params.message``: ``{role?, parts}``, at least one text part; no other member (closed, like its parts)."""

    role = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=64))
    parts = BoundedList(fields.Nested(TextPart), required=True, min_items=1, max_items=MAX_PARTS, noun="parts")

    @validates_schema
    def _has_text(self, data, **kwargs):
        if not any(p.get("text", "").strip() for p in data.get("parts", [])):
            raise ValidationError({"parts": ["at least one part must have non-empty text"]})


class FileDiff(StrictSchema):
    type = fields.String(required=True)
    path = _text(MAX_PATH)
    diff = _text(MAX_DIFF)


class FileRef(StrictSchema):
    type = fields.String(required=True)
    path = _text(MAX_PATH)
    line_start = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=MAX_LINE, error=f"must be 1-{MAX_LINE}")
    )
    line_end = fields.Integer(strict=True, validate=validate.Range(min=1, max=MAX_LINE, error=f"must be 1-{MAX_LINE}"))
    ref = _text(MAX_PATH, required=False)
    description = _text(MAX_SHORT, required=False)

    @validates_schema
    def _lines_in_order(self, data, **kwargs):
        if "line_start" in data and "line_end" in data and data["line_end"] < data["line_start"]:
            raise ValidationError({"line_end": ["must not be before line_start"]})


class TestCommand(StrictSchema):
    type = fields.String(required=True)
    command = _text(MAX_SHORT)
    cwd = _text(MAX_PATH, required=False)
    description = _text(MAX_SHORT, required=False)


class ApiContract(StrictSchema):
    type = fields.String(required=True)
    name = _text(MAX_PATH)
    spec = fields.Raw(required=True)
    format = _text(64, required=False)

    @validates_schema
    def _spec_shape(self, data, **kwargs):
        spec = data.get("spec")
        if not isinstance(spec, (str, dict)) or not spec:
            raise ValidationError({"spec": ["must be a non-empty string or object"]})
        if len(json.dumps(spec)) > MAX_DIFF:
            raise ValidationError({"spec": [f"must be at most {MAX_DIFF} bytes"]})


# RFC 6838's type/subtype names, then any parameters in printable ASCII; \Z, not $, so a
# trailing newline is refused too.
MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(?:[ \t]*;[\x20-\x7e]*)?\Z")


class Link(StrictSchema):
    type = fields.String(required=True)
    url = WebUrl(required=True, max_length=MAX_URL)
    title = _text(MAX_SHORT, required=False)
    # The media type of what the URL names (``text/plain``), as an A2A url part carries it.
    mediaType = fields.String(  # noqa: N815 (the A2A field's own spelling, shown back as sent)
        required=False,
        validate=[
            validate.Length(max=127),
            validate.Regexp(MEDIA_TYPE, error="must be a media type such as text/plain"),
        ],
    )


ARTIFACT_SCHEMAS: dict[str, Schema] = {
    "file_diff": FileDiff(),
    "file_ref": FileRef(),
    "test_command": TestCommand(),
    "api_contract": ApiContract(),
    "link": Link(),
}


class Artifact(fields.Field):
    """One artifact, validated by the schema of its ``type``."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, dict):
            raise ValidationError("must be an object")
        kind = value.get("type")
        schema = ARTIFACT_SCHEMAS.get(kind) if isinstance(kind, str) else None
        if schema is None:
            raise ValidationError({"type": [f"must be one of {', '.join(ARTIFACT_SCHEMAS)}"]})
        return schema.load(value)


class Metadata(fields.Dict):
    """Freeform metadata, bounded in size; ``client_idempotency_key`` must be a short string."""

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if len(json.dumps(value)) > MAX_METADATA_BYTES:
            raise ValidationError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON")
        key = value.get("client_idempotency_key")
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY):
            raise ValidationError(
                {"client_idempotency_key": [f"must be a string of 1-{MAX_IDEMPOTENCY_KEY} characters"]}
            )
        if isinstance(key, str) and key.startswith(RESERVED_KEY_PREFIX):
            raise ValidationError(
                {
                    "client_idempotency_key": [
                        f"must not start with {RESERVED_KEY_PREFIX!r}: that prefix holds A2A messageIds (docs/a2a.md)"
                    ]
                }
            )
        return value


class ProposedAction(StrictSchema):
    class Meta:
        unknown = RAISE

    description = _text(MAX_SHORT)
    target_files = BoundedList(_text(MAX_PATH), required=True, min_items=1, max_items=MAX_TARGET_FILES, noun="files")
    rationale = _text(MAX_SHORT)
    suggested_diff = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=MAX_DIFF))


class MessageSendParams(StrictSchema):
    """``message/send`` params (docs/api.md): create when ``task_id`` is null, else append."""

    class Meta:
        unknown = RAISE

    task_id = Ulid(load_default=None, allow_none=True)
    recipient = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=320))
    intent = fields.String(
        load_default=None,
        allow_none=True,
        validate=validate.OneOf(INTENTS, error=f"must be one of {', '.join(INTENTS)}"),
    )
    context_id = Ulid(load_default=None, allow_none=True)
    message = fields.Nested(MessageIn, required=True)
    artifacts = BoundedList(Artifact(), load_default=list, max_items=MAX_ARTIFACTS, noun="artifacts")
    proposed_action = fields.Nested(ProposedAction, load_default=None, allow_none=True)
    metadata = Metadata(load_default=dict)
    # The work lifecycle, create only: how urgent, and how long a pending handoff waits before it expires.
    priority = fields.String(load_default=None, allow_none=True, validate=PRIORITY_CHOICE)
    expires_in_seconds = fields.Integer(load_default=None, allow_none=True, strict=True, validate=EXPIRY_RANGE)


class TaskRef(StrictSchema):
    """``{task_id}``: params of tasks/get and tasks/cancel."""

    class Meta:
        unknown = RAISE

    task_id = Ulid(required=True)


MAX_SEQUENCE_NO = 2**31 - 1  # messages.sequence_no is an integer column
# A thread read's page bounds, for tasks/get and the REST thread read alike.
MESSAGES_LIMIT_RANGE = validate.Range(min=1, max=1000, error="must be 1-1000")
MESSAGES_AFTER_RANGE = validate.Range(min=0, max=MAX_SEQUENCE_NO, error="must be a sequence_no, 0 to 2147483647")


class MessagesPage(StrictSchema):
    """A thread read's optional page of messages: ``messages_limit`` 1-1000, ``messages_after`` >= 0.

    The rules: docs/decisions.md, "Paged reads and bounded answers".
    """

    class Meta:
        unknown = RAISE

    messages_limit = fields.Integer(load_default=None, strict=True, validate=MESSAGES_LIMIT_RANGE)
    messages_after = fields.Integer(load_default=None, strict=True, validate=MESSAGES_AFTER_RANGE)


class TaskGetParams(TaskRef, MessagesPage):
    """``tasks/get`` params: ``{task_id, messages_limit?, messages_after?}``; without a page, every message."""


class TransitionFields(StrictSchema):
    """A transition and its params, as ``tasks/update`` and the REST transitions route take them."""

    class Meta:
        unknown = RAISE

    transition = fields.String(
        required=True, validate=validate.OneOf(TRANSITIONS, error=f"must be one of {', '.join(TRANSITIONS)}")
    )
    session_id = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=255))
    result_summary = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=MAX_SHORT))
    # The work lifecycle: why (decline and fail require it), a lease's length, and the lease's fence.
    reason = fields.String(
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=MAX_REASON, error="must be 1-2000 characters"),
    )
    lease_seconds = fields.Integer(load_default=None, allow_none=True, strict=True, validate=LEASE_RANGE)
    lease_token = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=64))
    # What a request_input asks the sender.
    question = fields.String(
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=MAX_QUESTION, error=f"must be 1-{MAX_QUESTION} characters"),
    )

    @validates_schema
    def _transition_params(self, data, **kwargs):
        check_transition_params(data)


def transition_args(params: dict) -> dict:
    """The keyword arguments of ``threads.transition`` from loaded TransitionFields."""
    return {
        "name": params["transition"],
        **{k: params[k] for k in TRANSITION_PARAM_NAMES},
    }


class TasksUpdateParams(TransitionFields):
    """``tasks/update`` params: ``task_id`` and a transition (:data:`TRANSITION_PARAMS`)."""

    task_id = Ulid(required=True)


def check_transition_params(data: dict) -> None:
    """Refuse params that do not go with the transition (:data:`TRANSITION_PARAMS`).

    Raises ValidationError naming the field: a required param missing ("is required to
    decline a handoff (1-2000 characters)"), or one that belongs to other transitions
    ("is only allowed with decline, fail or release"). Params given as null are absent.
    """
    name = data.get("transition")
    if name not in TRANSITION_PARAMS:
        return  # the transition field's own error names it
    takes, required = TRANSITION_PARAMS[name]
    for field in sorted(required):
        if not data.get(field):
            raise ValidationError(f"is required to {name} a handoff (1-2000 characters)", field)
    for field in TRANSITION_PARAM_NAMES:
        if data.get(field) is not None and field not in takes:
            owners = [t for t, (params, _required) in TRANSITION_PARAMS.items() if field in params]
            listed = ", ".join(owners[:-1]) + f" or {owners[-1]}" if len(owners) > 1 else owners[0]
            raise ValidationError(f"is only allowed with {listed}, not {name}", field)


class OneOrList(BoundedList):
    """A list, or one value standing for a list of it (``"high"`` is ``["high"]``)."""

    def _deserialize(self, value, attr, data, **kwargs):
        return super()._deserialize([value] if isinstance(value, str) else value, attr, data, **kwargs)


class ListFilter(StrictSchema):
    class Meta:
        unknown = RAISE

    role = fields.String(load_default="recipient", validate=validate.OneOf(("recipient", "sender")))
    status = BoundedList(
        fields.String(validate=validate.OneOf(THREAD_STATES, error=f"must be one of {', '.join(THREAD_STATES)}")),
        load_default=None,
        allow_none=True,
        max_items=MAX_STATUS_FILTER,
        noun="states",
    )
    since = AwareDateTime(load_default=None, allow_none=True)
    priority = OneOrList(
        fields.String(validate=PRIORITY_CHOICE), load_default=None, allow_none=True, max_items=MAX_STATUS_FILTER,
        noun="priorities",
    )  # fmt: skip


class ListPage(StrictSchema):
    class Meta:
        unknown = RAISE

    limit = fields.Integer(load_default=50, strict=True, validate=validate.Range(min=1, max=200, error="must be 1-200"))
    cursor = Cursor(load_default=None, allow_none=True)


class TasksListParams(StrictSchema):
    """``tasks/list`` params: inbox (``recipient``) or sent (``sender``), keyset paging."""

    class Meta:
        unknown = RAISE

    filter = fields.Nested(ListFilter, load_default=lambda: ListFilter().load({}))
    page = fields.Nested(ListPage, load_default=lambda: ListPage().load({}))


# END
