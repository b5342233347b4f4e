"""OpenAPI 3.1 document of the REST API, generated from the routes and marshmallow schemas."""

from __future__ import annotations

import re

from flask import current_app

from relay.schemas.agents import AgentOut, KeyOut
from relay.schemas.common import Cursor, Ulid, WebUrl
from relay.schemas.handoffs import ARTIFACT_SCHEMAS, ApiContract, Artifact, MessageIn
from relay.schemas.rest import (
    DeliveriesQuery,
    FeedQuery,
    KeyCreateBody,
    ReplyBody,
    StreamQuery,
    TaskGetQuery,
    TaskListQuery,
    TransitionBody,
    WebhookCreateBody,
    WebhookUpdateBody,
)
from relay.transport.rest import bp
from relay.urls import URL_PATTERN

# endpoint -> what the document says beyond the route itself
ROUTE_DOCS: dict[str, dict] = {
    "api_v1.me": {"response": AgentOut, "tag": "identities"},
    "api_v1.list_messages": {"query": FeedQuery, "tag": "feed", "errors": (403, 404, 422)},
    "api_v1.stream_messages": {
        "query": StreamQuery,
        "tag": "feed",
        "errors": (403, 404, 422),
        "media": "text/event-stream",
        "headers": [{"in": "header", "name": "Last-Event-ID", "schema": {"type": "string", "format": "uuid"}}],
    },
    "api_v1.list_tasks": {"query": TaskListQuery, "tag": "tasks", "errors": (403, 404, 422)},
    "api_v1.get_task": {"query": TaskGetQuery, "tag": "tasks", "errors": (403, 404, 422)},
    "api_v1.reply": {"body": ReplyBody, "tag": "tasks", "status": 201, "errors": (403, 404, 409, 422)},
    "api_v1.transition": {"body": TransitionBody, "tag": "tasks", "errors": (403, 404, 409, 422)},
    "api_v1.audit": {"tag": "tasks", "errors": (403, 404, 422)},
    "api_v1.list_blocks": {"tag": "blocks", "errors": (403, 404)},
    "api_v1.block": {"tag": "blocks", "errors": (403, 404, 422)},
    "api_v1.unblock": {"tag": "blocks", "status": 204, "errors": (403, 404)},
    "api_v1.list_keys": {"tag": "keys", "errors": (403, 404)},
    "api_v1.create_key": {"body": KeyCreateBody, "tag": "keys", "status": 201, "errors": (403, 404, 422)},
    "api_v1.revoke_key": {"response": KeyOut, "tag": "keys", "errors": (403, 404, 422)},
    "api_v1.openapi": {"tag": "meta", "public": True},
    "api_v1.create_webhook": {"body": WebhookCreateBody, "tag": "webhooks", "status": 201, "errors": (403, 404, 422)},
    "api_v1.list_webhooks": {"tag": "webhooks", "errors": (403, 404)},
    "api_v1.get_webhook": {"tag": "webhooks", "errors": (403, 404, 422)},
    "api_v1.update_webhook": {
        "body": WebhookUpdateBody,
        "tag": "webhooks",
        "errors": (403, 404, 422),
        "body_constraints": {"minProperties": 1},
    },  # at least one field to change
    "api_v1.delete_webhook": {"tag": "webhooks", "status": 204, "errors": (403, 404, 422)},
    "api_v1.rotate_webhook_secret": {"tag": "webhooks", "errors": (403, 404, 422)},
    "api_v1.test_webhook": {"tag": "webhooks", "status": 202, "errors": (403, 404, 422)},
    "api_v1.list_webhook_deliveries": {"query": DeliveriesQuery, "tag": "webhooks", "errors": (403, 404, 422)},
}

# What the services accept in each path parameter; anything else answers 422 naming it.
HANDLE_SCHEMA = {"type": "string", "maxLength": 320, "pattern": r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+$"}
# A thread id: 26 Crockford base32 characters (the first at most 7) or a UUID (relay.ids.parse_ulid).
ULID_SCHEMA = {
    "type": "string",
    "pattern": (
        r"^([0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}|[0-9A-Fa-f]{32}"
        r"|[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12})$"
    ),
}
PATH_PARAMETERS: dict[str, dict] = {
    "handle": HANDLE_SCHEMA,
    "blocked_handle": HANDLE_SCHEMA,
    "task_id": ULID_SCHEMA,
    "webhook_id": {"type": "string", "format": "uuid"},
    "key_id": {"type": "string", "format": "uuid"},
}


# Python's str.strip() also removes U+001C..U+001F and U+0085, which ECMA-262's \s does not.
NON_BLANK = r"[^\s\x1c-\x1f\x85]"


def _custom_fields(self, field, **kwargs) -> dict:
    """apispec attribute function: what the project's own fields and validators accept."""
    if isinstance(field, Ulid):
        return dict(ULID_SCHEMA)
    if isinstance(field, Cursor):
        return {"type": "string", "maxLength": 200, "description": "opaque cursor returned by this API"}
    if isinstance(field, Artifact):
        variants = []
        for kind, schema in ARTIFACT_SCHEMAS.items():
            variant = self.schema2jsonschema(schema)
            variant["properties"]["type"] = {"type": "string", "enum": [kind]}
            if isinstance(schema, ApiContract):  # a non-empty string or object
                variant["properties"]["spec"] = {"type": ["string", "object"], "minLength": 1, "minProperties": 1}
            variants.append(variant)
        return {"oneOf": variants}
    if isinstance(field, WebUrl):  # relay.urls: http or https, in any case
        return {"type": "string", "format": "uri", "pattern": URL_PATTERN, "maxLength": field.max_length}
    if field.name == "parts" and isinstance(field.parent, MessageIn):
        # MessageIn._has_text: at least one part must have non-blank text.
        return {
            "contains": {
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string", "pattern": NON_BLANK}},
            }
        }
    return {}


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {}},
        }
    },
}


def build_spec() -> dict:
    """Return the OpenAPI document for every route of the ``api_v1`` blueprint."""
    # apispec (and the YAML it pulls in) loads with the first document asked for, not with
    # every web process: the document is read by people and tools, not on any hot path.
    from apispec import APISpec
    from apispec.ext.marshmallow import MarshmallowPlugin

    marshmallow_plugin = MarshmallowPlugin()
    spec = APISpec(title="Handoff relay REST API", version="1", openapi_version="3.1.0", plugins=[marshmallow_plugin])
    marshmallow_plugin.converter.add_attribute_function(_custom_fields)
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer", "bearerFormat": "ah_live_ key"})
    spec.components.schema("Error", ERROR_SCHEMA)
    for rule in current_app.url_map.iter_rules():
        if not rule.endpoint.startswith("api_v1."):
            continue
        doc = ROUTE_DOCS.get(rule.endpoint, {})
        view = current_app.view_functions[rule.endpoint]
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        operations = {}
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            status = str(doc.get("status", 200))
            op: dict = {
                "operationId": rule.endpoint.split(".", 1)[1],
                "summary": (view.__doc__ or "").strip().splitlines()[0] if view.__doc__ else rule.endpoint,
                "tags": [doc.get("tag", "api")],
                "parameters": [
                    {
                        "in": "path",
                        "name": arg,
                        "required": True,
                        "schema": dict(PATH_PARAMETERS.get(arg, {"type": "string"})),
                    }
                    for arg in sorted(rule.arguments)
                ],
                "responses": {status: {"description": "success"}},
            }
            if "response" in doc:
                op["responses"][status]["content"] = {"application/json": {"schema": doc["response"]}}
            if "media" in doc:
                op["responses"][status]["content"] = {doc["media"]: {"schema": {"type": "string"}}}
            op["parameters"].extend(doc.get("headers", ()))
            if "query" in doc:
                op["parameters"].append({"in": "query", "schema": doc["query"]})
            if "body" in doc:
                body = {"allOf": [doc["body"]], **doc["body_constraints"]} if "body_constraints" in doc else doc["body"]
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
            if not doc.get("public"):
                op["security"] = [{"bearer": []}]
                # A malformed handle or id in the path is 422 on every route that takes one;
                # a body past RELAY_MAX_BODY_BYTES is 413, and one that is not JSON 400 parse_error.
                errors = {
                    401,
                    429,
                    *doc.get("errors", ()),
                    *((422,) if rule.arguments else ()),
                    *((400, 413) if "body" in doc else ()),
                }
                for code in sorted(errors):
                    op["responses"][str(code)] = {
                        "description": "error",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    }
            operations[method.lower()] = op
        spec.path(path=path, operations=operations)
    return spec.to_dict()


@bp.get("/openapi.json")
def openapi():
    """Return this OpenAPI document."""
    return build_spec()
