"""OpenAPI 3.1 document of the REST API, generated from the routes and marshmallow schemas."""
from __future__ import annotations

import re

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask import current_app

from relay.api import bp
from relay.schemas.agents import AgentOut, KeyOut
from relay.schemas.rest import (DeliveriesQuery, FeedQuery, KeyCreateBody, ReplyBody, TaskListQuery, TransitionBody,
                                WebhookCreateBody, WebhookUpdateBody)

# endpoint -> what the document says beyond the route itself
ROUTE_DOCS: dict[str, dict] = {
    "api_v1.me": {"response": AgentOut, "tag": "identities"},
    "api_v1.list_messages": {"query": FeedQuery, "tag": "feed", "errors": (403, 404, 422)},
    "api_v1.list_tasks": {"query": TaskListQuery, "tag": "tasks", "errors": (403, 404, 422)},
    "api_v1.get_task": {"tag": "tasks", "errors": (403, 404, 422)},
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
    "api_v1.update_webhook": {"body": WebhookUpdateBody, "tag": "webhooks", "errors": (403, 404, 422)},
    "api_v1.delete_webhook": {"tag": "webhooks", "status": 204, "errors": (403, 404, 422)},
    "api_v1.rotate_webhook_secret": {"tag": "webhooks", "errors": (403, 404, 422)},
    "api_v1.test_webhook": {"tag": "webhooks", "status": 202, "errors": (403, 404, 422)},
    "api_v1.list_webhook_deliveries": {"query": DeliveriesQuery, "tag": "webhooks", "errors": (403, 404, 422)},
}

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"}, "details": {}}}},
}


def build_spec() -> dict:
    """Return the OpenAPI document for every route of the ``api_v1`` blueprint."""
    spec = APISpec(title="Handoff relay REST API", version="1", openapi_version="3.1.0",
                   plugins=[MarshmallowPlugin()])
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
                "parameters": [{"in": "path", "name": arg, "required": True, "schema": {"type": "string"}}
                               for arg in sorted(rule.arguments)],
                "responses": {status: {"description": "success"}},
            }
            if "response" in doc:
                op["responses"][status]["content"] = {"application/json": {"schema": doc["response"]}}
            if "query" in doc:
                op["parameters"].append({"in": "query", "schema": doc["query"]})
            if "body" in doc:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": doc["body"]}}}
            if not doc.get("public"):
                op["security"] = [{"bearer": []}]
                for code in (401, 429, *doc.get("errors", ())):
                    op["responses"][str(code)] = {"description": "error", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            operations[method.lower()] = op
        spec.path(path=path, operations=operations)
    return spec.to_dict()


@bp.get("/openapi.json")
def openapi():
    """Return this OpenAPI document."""
    return build_spec()
