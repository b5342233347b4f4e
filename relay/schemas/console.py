"""The console's query strings and form bodies (relay/transport/console), loaded like the API's.

A console URL may carry parameters a person or a tool added (``utm_...``): they are
ignored, not refused. Form fields are strings; ``csrf_token`` is checked by flask-wtf
before anything here runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from marshmallow import EXCLUDE, Schema, ValidationError, fields, post_load, pre_load, validate

from relay.models import PRIORITIES, THREAD_STATES
from relay.schemas.common import Cursor, to_utc
from relay.services.operators import AUDIT_ACTIONS

MAX_QUERY = 500  # as the feed's q


class _Lenient(Schema):
    class Meta:
        unknown = EXCLUDE


class InboxQuery(_Lenient):
    """``/console/agents/<handle>``: ``box`` (inbox | sent), ``state`` and ``priority`` (each
    repeatable: any of them), ``cursor``."""

    REPEATED = ("state", "priority")

    box = fields.String(load_default="inbox", validate=validate.OneOf(("inbox", "sent")))
    state = fields.List(
        fields.String(validate=validate.OneOf(THREAD_STATES, error=f"must be one of {', '.join(THREAD_STATES)}")),
        load_default=list,
        validate=validate.Length(max=len(THREAD_STATES)),
    )
    priority = fields.List(
        fields.String(validate=validate.OneOf(PRIORITIES, error=f"must be one of {', '.join(PRIORITIES)}")),
        load_default=list,
        validate=validate.Length(max=len(PRIORITIES)),
    )
    cursor = Cursor(load_default=None)

    @pre_load
    def _lists(self, data, **kwargs):
        # From request.args.to_dict(flat=False): every value is a list; state and priority repeat.
        out = {k: (v if k in self.REPEATED else v[-1]) for k, v in data.items() if v}
        for name in self.REPEATED:
            out[name] = sorted({s for s in out.get(name, []) if s})
        return out


class SearchQuery(_Lenient):
    """``/console/search``: ``q`` (absent or blank: no search yet) and ``cursor``."""

    q = fields.String(
        load_default="", validate=validate.Length(max=MAX_QUERY, error=f"must be at most {MAX_QUERY} characters")
    )
    cursor = Cursor(load_default=None)

    @pre_load
    def _last(self, data, **kwargs):
        return {k: v[-1] for k, v in data.items() if v}

    @post_load
    def _strip(self, data, **kwargs):
        data["q"] = data["q"].strip()
        return data


class DeliveriesQuery(_Lenient):
    """``/console/agents/<handle>/webhooks``: ``webhook`` (one endpoint's older deliveries) and ``cursor``."""

    webhook = fields.UUID(load_default=None)  # not "endpoint": url_for takes that name itself
    cursor = Cursor(load_default=None)

    @pre_load
    def _last(self, data, **kwargs):
        return {k: v[-1] for k, v in data.items() if v}


class RecoverForm(_Lenient):
    """Recover: ``since`` as a browser's ``datetime-local`` value (``2026-01-02T03:04[:05]``) or an
    ISO 8601 time with an offset; ``tz_offset`` is the browser's ``getTimezoneOffset()``
    (minutes to add to local time for UTC), written by the console's time.js. A local time
    with no ``tz_offset`` is taken as UTC, as the form says."""

    since = fields.String(required=True, validate=validate.Length(min=1, max=64))
    tz_offset = fields.Integer(load_default=0, validate=validate.Range(min=-24 * 60, max=24 * 60))

    @pre_load
    def _blank_offset(self, data, **kwargs):
        data = dict(data)
        if not str(data.get("tz_offset", "")).strip():
            data.pop("tz_offset", None)
        return data

    @post_load
    def _to_utc(self, data, **kwargs):
        return {"since": form_time(data["since"], data["tz_offset"], "since")}


def form_time(raw: str, tz_offset: int, field: str) -> datetime:
    """A form's time (``datetime-local`` or ISO 8601 with an offset) in UTC; a local time is
    shifted by ``tz_offset`` minutes. Raises ValidationError naming ``field``."""
    try:
        when = datetime.fromisoformat(raw.strip().replace("z", "Z"))
    except ValueError:
        raise ValidationError({field: ["must be a date and time such as 2026-04-20T09:30"]}) from None
    if when.tzinfo is None:
        try:
            when = (when + timedelta(minutes=tz_offset)).replace(tzinfo=UTC)
        except OverflowError:
            raise ValidationError({field: ["is out of range (years 1-9999 in UTC)"]}) from None
    try:
        return to_utc(when)
    except ValidationError:
        raise ValidationError({field: ["is out of range (years 1-9999 in UTC)"]}) from None


class AuditQuery(_Lenient):
    """``/console/audit``: ``operator`` (an email), ``action``, ``since`` and ``until`` (UTC unless
    they carry an offset; ``tz_offset`` as for :class:`RecoverForm`), ``cursor``. Blank is absent."""

    operator = fields.String(
        load_default=None, validate=validate.Length(max=320, error="must be at most 320 characters")
    )
    action = fields.String(
        load_default=None,
        validate=validate.OneOf(AUDIT_ACTIONS, error=f"must be one of {', '.join(AUDIT_ACTIONS)}"),
    )
    since = fields.String(load_default=None, validate=validate.Length(max=64))
    until = fields.String(load_default=None, validate=validate.Length(max=64))
    tz_offset = fields.Integer(load_default=0, validate=validate.Range(min=-24 * 60, max=24 * 60))
    cursor = Cursor(load_default=None, ident=int)

    @pre_load
    def _last(self, data, **kwargs):
        return {k: v[-1] for k, v in data.items() if v and v[-1].strip()}

    @post_load
    def _times(self, data, **kwargs):
        for name in ("since", "until"):
            if data[name] is not None:
                data[name] = form_time(data[name], data["tz_offset"], name)
        return data


class BulkRedriveQuery(_Lenient):
    """A bulk redrive's preview: ``since`` (required) and ``until`` (default now), as
    :class:`RecoverForm`'s ``since`` (``tz_offset`` for local times)."""

    since = fields.String(required=True, validate=validate.Length(min=1, max=64))
    until = fields.String(load_default=None, validate=validate.Length(max=64))
    tz_offset = fields.Integer(load_default=0, validate=validate.Range(min=-24 * 60, max=24 * 60))

    @pre_load
    def _last(self, data, **kwargs):
        return {k: v[-1] for k, v in data.items() if v and v[-1].strip()}

    @post_load
    def _times(self, data, **kwargs):
        until = data["until"]
        return {
            "since": form_time(data["since"], data["tz_offset"], "since"),
            "until": form_time(until, data["tz_offset"], "until") if until else None,
        }


class BulkRedriveForm(_Lenient):
    """A bulk redrive's confirmation: the preview's ``job_id`` and its window, ISO 8601 with an offset."""

    job_id = fields.UUID(required=True)
    since = fields.String(required=True, validate=validate.Length(min=1, max=64))
    until = fields.String(required=True, validate=validate.Length(min=1, max=64))

    @post_load
    def _times(self, data, **kwargs):
        # As the preview's: UTC within PostgreSQL's range, or the field named (never a 500).
        return {**data, "since": form_time(data["since"], 0, "since"), "until": form_time(data["until"], 0, "until")}


class KeyForm(_Lenient):
    """Create a key: ``label`` (0-200 characters)."""

    label = fields.String(load_default="", validate=validate.Length(max=200, error="must be at most 200 characters"))


class BlockForm(_Lenient):
    """Block a sender: ``blocked_handle``."""

    blocked_handle = fields.String(
        required=True, validate=validate.Length(min=1, max=320, error="must be a handle such as frank@acme")
    )
