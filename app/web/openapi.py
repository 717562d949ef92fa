"""The API's OpenAPI document (served at /openapi.json), written from the
same tables the server runs on: error codes and their statuses, job
statuses and job error codes from app/vocabulary.py, the limits from
app/web/body.py, the providers from app/config.py. Where the document
describes a response, the server sends exactly that (`make fuzz` checks
every answer against it)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from app.config import PROVIDERS
from app.delivery import MAX_URL_CHARS
from app.domain.notifications import MAX_ENDPOINTS_PER_OWNER
from app.domain.owners import MAX_GRANT, MAX_OWNER_ACTIVE, MAX_OWNER_NAME
from app.ids import ENDPOINT_ID, JOB_ID, NOTIFICATION_ID, OWNER_ID
from app.models_file import PRICE_UNITS
from app.vocabulary import (
    ALL_STATUSES,
    API_ERROR_STATUS,
    ApiErrorCode,
    DeliveryStatus,
    EventType,
    JobError,
    JobStatus,
    NotificationType,
    ProviderKind,
)
from app.web.body import (
    IDEMPOTENCY_KEY_PATTERN,
    MAX_CREDITS,
    MAX_CURSOR,
    MAX_IDEMPOTENCY_KEY,
    MAX_LIST_LIMIT,
    MAX_METADATA_BYTES,
    MAX_MODEL_LENGTH,
    MAX_OUTPUT_INDEX_DIGITS,
    MAX_PROVIDER_TASK_ID,
    MAX_WAIT_S,
)
from app.web.outputs import OCTET_STREAM
from app.web.owners import DEFAULT_MAX_ACTIVE, MAX_GRANT_REASON

_JOB = {"$ref": "#/components/schemas/Job"}
_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before trying again", "required": True,
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
# The answers that carry headers of their own (CONTRACT.md: HTTP API).
_ERROR_HEADERS: dict[ApiErrorCode, dict] = {
    ApiErrorCode.CAPACITY_EXHAUSTED: _RETRY_AFTER,
    ApiErrorCode.UNAVAILABLE: _RETRY_AFTER,
}


def _json(description: str, schema: dict, headers: dict | None = None) -> dict:
    r: dict = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        r["headers"] = headers
    return r


def error_schema(codes: list[str]) -> dict:
    return {"type": "object", "required": ["error"], "additionalProperties": False, "properties": {"error": {
        "type": "object", "required": ["code", "message"], "additionalProperties": False,
        "properties": {"code": {"type": "string", "enum": codes}, "message": _STRING}}}}


def _errors(*codes: ApiErrorCode) -> dict:
    """Responses for these error codes, grouped by status: each status lists
    exactly the codes the vocabulary gives it."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(API_ERROR_STATUS[code], []).append(code.value)
    responses = {}
    for status, names in sorted(by_status.items()):
        headers: dict = {}
        for name in names:
            headers.update(_ERROR_HEADERS.get(ApiErrorCode(name), {}))
        responses[str(status)] = _json(", ".join(names), error_schema(names), headers)
    return responses


E = ApiErrorCode
# Every route that reads the database may answer 503 while it is out of reach.
_DB = (E.UNAVAILABLE,)
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "pattern": JOB_ID.pattern}}
_TOKEN = {"name": "token", "in": "query", "required": False, "description": "the job's read token (status_url)",
          "schema": _STRING}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
# `?limit=` and `?cursor=` of every list.
_PAGE = [{"name": "limit", "in": "query", "required": False,
          "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": 20}},
         {"name": "cursor", "in": "query", "required": False, "description": "a next_cursor from a page",
          "schema": {"type": "string", "maxLength": MAX_CURSOR}}]

SCHEMAS = {
    "Error": error_schema([c.value for c in ApiErrorCode]),
    "CreateJob": {
        "type": "object", "additionalProperties": False,
        "required": ["provider", "model", "input", "max_credits"],
        "properties": {
            "provider": {"type": "string", "enum": list(PROVIDERS)},
            "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_LENGTH, "pattern": r"\S",
                      "description": "not blank; no NUL, no lone surrogate"},
            "input": {"type": "object", "description": "any JSON object: no NUL, no lone surrogate, finite "
                                                       "numbers, the whole body nested at most 64 deep"},
            "max_credits": {"type": "integer", "minimum": 1, "maximum": MAX_CREDITS},
            "metadata": {"type": "object", "description": "anything the app wants echoed back (in the job, its "
                                                          "notifications and its `created` event): at most "
                                                          f"{MAX_METADATA_BYTES} bytes as compact UTF-8 JSON; "
                                                          "never sent to a provider"}}},
    "Output": {
        "type": "object", "additionalProperties": False,
        "required": ["index", "url", "content_type", "bytes", "sha256", "label"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "url": _STRING,
                       "content_type": {"type": ["string", "null"]}, "bytes": {"type": "integer", "minimum": 0},
                       "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                       "label": {"type": ["string", "null"],
                                 "description": "names the output when a task has several kinds "
                                                "(a dubbing language, a track)"}}},
    "Job": {
        "type": "object", "additionalProperties": False,
        "required": ["id", "owner_id", "status", "provider", "model", "input", "created_at", "updated_at",
                     "finished_at", "credits", "outputs", "error", "metadata", "status_url"],
        "properties": {
            "id": {"type": "string", "pattern": JOB_ID.pattern},
            "owner_id": {"type": "string", "pattern": OWNER_ID.pattern},
            "status": {"type": "string", "enum": [s.value for s in ALL_STATUSES]},
            "provider": {"type": "string", "enum": list(PROVIDERS)},
            "model": _STRING,
            "input": {"type": "object"},
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"},
            "finished_at": _NULLABLE_TIME,
            "credits": {"type": "object", "additionalProperties": False,
                        "required": ["reserved", "charged", "refunded"],
                        "properties": {"reserved": _INTEGER, "charged": _INTEGER, "refunded": _INTEGER}},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/Output"}},
            "error": {"oneOf": [{"type": "null"}, {
                "type": "object", "additionalProperties": False, "required": ["code", "message"],
                "properties": {"code": {"type": "string", "enum": [c.value for c in JobError]},
                               "message": _STRING}}]},
            "metadata": {"type": "object"},
            "status_url": _STRING}},
    "Account": {
        "type": "object", "additionalProperties": False,
        "required": ["owner_id", "credits", "active", "max_active"],
        "properties": {
            "owner_id": _STRING,
            "credits": {"type": "object", "additionalProperties": False,
                        "required": ["balance", "reserved", "charged"],
                        "properties": {"balance": _INTEGER, "reserved": _INTEGER, "charged": _INTEGER}},
            "active": _INTEGER, "max_active": _INTEGER}},
    "Model": {
        "type": "object", "additionalProperties": False,
        "required": ["provider", "model", "price", "give_up_after_s", "kind"],
        "properties": {
            "provider": {"type": "string", "enum": list(PROVIDERS)},
            "model": _STRING,
            "price": {"oneOf": [{"type": "null"}, {
                "type": "object", "additionalProperties": False, "required": ["credits", "per"],
                "properties": {"credits": {"type": "number", "minimum": 0},
                               "per": {"type": "string", "enum": list(PRICE_UNITS)}}}]},
            "give_up_after_s": {"type": "number"},
            "kind": {"type": "string", "enum": [k.value for k in ProviderKind]}}},
    "Event": {
        "type": "object", "additionalProperties": False, "required": ["at", "type", "detail"],
        "properties": {"at": {"type": "string", "format": "date-time"},
                       "type": {"type": "string", "enum": [t.value for t in EventType]},
                       "detail": {"type": "object"}}},
    "WebhookEndpoint": {
        "type": "object", "additionalProperties": False, "required": ["id", "url", "events", "created_at"],
        "properties": {"id": {"type": "string", "pattern": ENDPOINT_ID.pattern}, "url": _STRING,
                       "events": {"type": "array", "items": {"type": "string",
                                                             "enum": [t.value for t in NotificationType]}},
                       "created_at": {"type": "string", "format": "date-time"}}},
    "Notification": {
        "type": "object", "additionalProperties": False,
        "required": ["id", "type", "job_id", "created_at", "deliveries"],
        "properties": {
            "id": {"type": "string", "pattern": NOTIFICATION_ID.pattern},
            "type": {"type": "string", "enum": [t.value for t in NotificationType]},
            "job_id": {"type": "string", "pattern": JOB_ID.pattern},
            "created_at": {"type": "string", "format": "date-time"},
            "deliveries": {"type": "array", "items": {
                "type": "object", "additionalProperties": False,
                "required": ["endpoint_id", "status", "attempts", "last_status_code", "last_attempt_at"],
                "properties": {"endpoint_id": {"type": "string", "pattern": ENDPOINT_ID.pattern},
                               "status": {"type": "string", "enum": [s.value for s in DeliveryStatus]},
                               "attempts": {"type": "integer", "minimum": 0},
                               "last_status_code": {"type": ["integer", "null"]},
                               "last_attempt_at": _NULLABLE_TIME}}}}},
    "Owner": {
        "type": "object", "additionalProperties": False,
        "required": ["owner_id", "name", "credits", "active", "max_active", "created_at"],
        "properties": {
            "owner_id": {"type": "string", "pattern": OWNER_ID.pattern},
            "name": _STRING,
            "credits": {"type": "object", "additionalProperties": False,
                        "required": ["granted", "balance", "reserved", "charged"],
                        "description": "granted = balance + reserved + charged",
                        "properties": {"granted": _INTEGER, "balance": _INTEGER, "reserved": _INTEGER,
                                       "charged": _INTEGER}},
            "active": _INTEGER, "max_active": _INTEGER,
            "created_at": {"type": "string", "format": "date-time"}}},
    "Health": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"},
                                                                  "database": _STRING}},
}

_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": f"1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters, surrounding whitespace stripped",
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY,
               "pattern": IDEMPOTENCY_KEY_PATTERN}}
# A preflight answers the same for any path (it tells nothing about a job).
_CORS_PREFLIGHT = {"summary": "CORS preflight (token reads answer cross-origin)", "security": [],
                   "responses": {"204": {"description": "allowed"}}}
_ANY_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": _STRING}

# What a created job's id leads to (OpenAPI links: clients and fuzzers follow them).
_JOB_LINKS = {
    "readJob": {"operationId": "readJob", "parameters": {"job_id": "$response.body#/id"}},
    "cancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/id"}},
    "readOutput": {"operationId": "readOutput", "parameters": {"job_id": "$response.body#/id", "index": "0"}},
}


def _linked(response: dict) -> dict:
    return {**response, "links": _JOB_LINKS}


_OWNER = {"$ref": "#/components/schemas/Owner"}
_OWNER_ID = {"name": "owner_id", "in": "path", "required": True, "schema": _STRING}
_GRANT_KEY = {**_IDEMPOTENCY_KEY, "required": True,
              "description": f"{_IDEMPOTENCY_KEY['description']}; required: a grant moves money"}
# A platform's key acts for one of its owners (CONTRACT.md: Apps with many users).
_ACTING = {"name": "Longcall-Owner", "in": "header", "required": False,
           "description": "with a platform owner's key: act as this owner, which must be under the platform "
                          "(else 404, the same answer as for an unknown owner)",
           "schema": _STRING}
_PLATFORM_ONLY = "A platform owner's key only (any other key: 404; with Longcall-Owner: 400). "

OWNER_PATHS = {
    "/v1/owners": {
        "post": {
            "operationId": "createOwner",
            "summary": _PLATFORM_ONLY + "Create an owner under this platform",
            "parameters": [_IDEMPOTENCY_KEY],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "required": ["name"],
                "properties": {"name": {"type": "string", "minLength": 1, "maxLength": MAX_OWNER_NAME,
                                        "pattern": r"\S"},
                               "credits": {"type": "integer", "minimum": 0, "maximum": MAX_GRANT,
                                           "default": 0},
                               "max_active": {"type": "integer", "minimum": 0, "maximum": MAX_OWNER_ACTIVE,
                                              "default": DEFAULT_MAX_ACTIVE}}}}}},
            "responses": {
                "201": _json("created", _OWNER, {"Location": {"required": True, "schema": _STRING}}),
                "200": _json("the same key and body again: the same owner", _OWNER,
                             {"Location": {"required": True, "schema": _STRING}}),
                **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, E.IDEMPOTENCY_CONFLICT,
                          E.PAYLOAD_TOO_LARGE, *_DB)}},
        "get": {
            "operationId": "listOwners",
            "summary": _PLATFORM_ONLY + "This platform's owners, newest first",
            "parameters": [*_PAGE],
            "responses": {
                "200": _json("a page of owners", {
                    "type": "object", "additionalProperties": False, "required": ["owners", "next_cursor"],
                    "properties": {"owners": {"type": "array", "items": _OWNER},
                                   "next_cursor": {"type": ["string", "null"]}}}),
                **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, *_DB)}},
    },
    "/v1/owners/{owner_id}": {"get": {
        "operationId": "readOwner",
        "summary": _PLATFORM_ONLY + "One owner under this platform",
        "parameters": [_OWNER_ID],
        "responses": {"200": _json("the owner", _OWNER),
                      **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, *_DB)}}},
    "/v1/owners/{owner_id}/grants": {"post": {
        "operationId": "grantCredits",
        "summary": _PLATFORM_ONLY + "Grant credits to an owner, or take them back (negative; never below a "
                                    "zero balance). Each grant is a ledger entry",
        "parameters": [_OWNER_ID, _GRANT_KEY],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False, "required": ["credits"],
            "properties": {"credits": {"type": "integer", "minimum": -MAX_GRANT, "maximum": MAX_GRANT,
                                       "not": {"const": 0}},
                           "reason": {"type": ["string", "null"], "maxLength": MAX_GRANT_REASON}}}}}},
        "responses": {
            "201": _json("granted: the owner after it", _OWNER),
            "200": _json("the same key and body again: nothing moved", _OWNER),
            **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, E.INSUFFICIENT_CREDITS,
                      E.IDEMPOTENCY_CONFLICT, E.PAYLOAD_TOO_LARGE, *_DB)}}},
}

PATHS = {
    "/v1/jobs": {
        "post": {
            "operationId": "createJob",
            "summary": "Create a job (no provider call happens in this request)",
            "parameters": [_IDEMPOTENCY_KEY],
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/CreateJob"}}}},
            "responses": {
                "202": _linked(_json("created", _JOB, {"Location": {"required": True, "schema": _STRING}})),
                "200": _linked(_json("the same key and payload again: the same job", _JOB,
                                     {"Location": {"required": True, "schema": _STRING}})),
                **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.INSUFFICIENT_CREDITS, E.IDEMPOTENCY_CONFLICT,
                          E.PAYLOAD_TOO_LARGE, E.UNKNOWN_PROVIDER, E.CAPACITY_EXHAUSTED, *_DB)}},
        "get": {
            "operationId": "listJobs",
            "summary": "The owner's jobs, newest first",
            "parameters": [
                {"name": "status", "in": "query", "required": False,
                 "schema": {"type": "string", "enum": [s.value for s in ALL_STATUSES]}},
                *_PAGE],
            "responses": {
                "200": _json("a page of jobs", {
                    "type": "object", "additionalProperties": False, "required": ["jobs", "next_cursor"],
                    "properties": {"jobs": {"type": "array", "items": _JOB},
                                   "next_cursor": {"type": ["string", "null"]}}}),
                **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, *_DB)}},
    },
    "/v1/jobs/{job_id}": {
        "get": {
            "operationId": "readJob",
            "summary": "Read a job (API key, or its read token)",
            "security": [{"bearer": []}, {}],
            "parameters": [_JOB_ID, _TOKEN,
                           {"name": "wait", "in": "query", "required": False,
                            "description": "hold the request until the job changes or this many seconds pass",
                            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S}}],
            "responses": {"200": _json("the job", _JOB),
                          **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, *_DB)}},
        "options": {**_CORS_PREFLIGHT, "operationId": "jobPreflight", "parameters": [_ANY_JOB_ID]},
    },
    "/v1/jobs/{job_id}/cancel": {"post": {
        "operationId": "cancelJob",
        "summary": "Cancel a job not yet terminal (refunded in this request)",
        "parameters": [_JOB_ID],
        "responses": {"200": _json("the cancelled job", _JOB),
                      **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, E.INVALID_STATE, E.PAYLOAD_TOO_LARGE, *_DB)}}},
    "/v1/jobs/{job_id}/outputs/{index}": {
        "get": {
            "operationId": "readOutput",
            "summary": "An output's bytes (or a redirect to a short-lived URL with the same headers); "
                       "inline only for passive image/audio/video types, else an attachment",
            "security": [{"bearer": []}, {}],
            "parameters": [_JOB_ID,
                           {"name": "index", "in": "path", "required": True,
                            "description": "ASCII digits without sign or leading zeros",
                            "schema": {"type": "string",
                                       "pattern": f"^(0|[1-9][0-9]{{0,{MAX_OUTPUT_INDEX_DIGITS - 1}}})$"}},
                           _TOKEN],
            "responses": {
                "200": {"description": "the bytes",
                        "headers": {
                            "Content-Disposition": {"required": True, "schema": _STRING},
                            "X-Content-Type-Options": {"required": True, "schema": {"const": "nosniff"}},
                            "Content-Security-Policy": {"required": True, "schema": {"const": "sandbox"}}},
                        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}},
                                    OCTET_STREAM: {"schema": {"type": "string", "format": "binary"}}}},
                "302": {"description": "a presigned URL (S3 storage)",
                        "headers": {"Location": {"required": True, "schema": _STRING}}},
                **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, *_DB)}},
        "options": {**_CORS_PREFLIGHT, "operationId": "outputPreflight", "parameters": [
            _ANY_JOB_ID, {"name": "index", "in": "path", "required": True, "schema": _STRING}]},
    },
    "/v1/account": {"get": {
        "operationId": "readAccount",
        "summary": "The owner's credits and capacity",
        "responses": {"200": _json("the account", {"$ref": "#/components/schemas/Account"}),
                      **_errors(E.UNAUTHENTICATED, *_DB)}}},
    "/v1/models": {"get": {
        "operationId": "listModels",
        "summary": "The models file's entries: each model's price, give-up and kind (sync or async)",
        "responses": {"200": _json("the entries, in the file's order", {
            "type": "object", "additionalProperties": False, "required": ["models"],
            "properties": {"models": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}}}),
            **_errors(E.UNAUTHENTICATED, *_DB)}}},
    "/v1/admin/jobs/{job_id}/resolve": {"post": {
        "operationId": "resolveJob",
        "summary": "Resolve an uncertain job (Authorization: Bearer ADMIN_TOKEN; 404 while it is unset)",
        "parameters": [_JOB_ID],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["provider_task_id"],
             "properties": {"provider_task_id": {"type": "string", "minLength": 1,
                                                 "maxLength": MAX_PROVIDER_TASK_ID}}},
            {"type": "object", "additionalProperties": False, "required": ["outcome"],
             "properties": {"outcome": {"const": JobStatus.FAILED.value}}}]}}}},
        "responses": {"200": _json("the job", _JOB),
                      **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.NOT_FOUND, E.INVALID_STATE,
                                E.PAYLOAD_TOO_LARGE, *_DB)}}},
    "/webhooks/{provider}/{job_id}": {"post": {
        "operationId": "receiveWebhook",
        "summary": "Provider webhooks, verified at arrival on the raw bytes; one uniform 401 for any failure",
        "security": [],
        "parameters": [{"name": "provider", "in": "path", "required": True, "schema": _STRING},
                       {"name": "job_id", "in": "path", "required": True, "schema": _STRING}],
        "requestBody": {"required": False, "content": {"*/*": {"schema": {}}}},
        "responses": {"204": {"description": "accepted"},
                      **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, E.PAYLOAD_TOO_LARGE, *_DB)}}},
    "/v1/jobs/{job_id}/events": {
        "get": {
            "operationId": "readJobEvents",
            "summary": "The job's timeline, oldest first (API key, or its read token)",
            "security": [{"bearer": []}, {}],
            "parameters": [_JOB_ID, _TOKEN],
            "responses": {"200": _json("the timeline", {
                "type": "object", "additionalProperties": False, "required": ["events"],
                "properties": {"events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}}}),
                **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, *_DB)}},
        "options": {**_CORS_PREFLIGHT, "operationId": "eventsPreflight", "parameters": [_ANY_JOB_ID]},
    },
    "/v1/webhook-endpoints": {
        "post": {
            "operationId": "createWebhookEndpoint",
            "summary": "Register a notification endpoint: https at a public address (or an origin in "
                       f"NOTIFY_ALLOWED_ORIGINS); at most {MAX_ENDPOINTS_PER_OWNER} per owner. The secret "
                       "is shown only here",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "required": ["url"],
                "properties": {"url": {"type": "string", "minLength": 1, "maxLength": MAX_URL_CHARS},
                               "events": {"type": ["array", "null"], "minItems": 1, "items": {
                                   "type": "string", "enum": [t.value for t in NotificationType]},
                                   "description": "default: every terminal event"}}}}}},
            "responses": {
                "201": _json("the endpoint, with its secret", {
                    "type": "object", "additionalProperties": False,
                    "required": ["id", "url", "events", "created_at", "secret"],
                    "properties": {**SCHEMAS["WebhookEndpoint"]["properties"],
                                   "secret": {"type": "string", "pattern": "^whsec_[A-Za-z0-9+/]+=*$"}}}),
                **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, E.PAYLOAD_TOO_LARGE, *_DB)}},
        "get": {
            "operationId": "listWebhookEndpoints",
            "summary": "The owner's endpoints (no secrets)",
            "responses": {"200": _json("the endpoints, oldest first", {
                "type": "object", "additionalProperties": False, "required": ["webhook_endpoints"],
                "properties": {"webhook_endpoints": {
                    "type": "array", "items": {"$ref": "#/components/schemas/WebhookEndpoint"}}}}),
                **_errors(E.UNAUTHENTICATED, *_DB)}},
    },
    "/v1/webhook-endpoints/{endpoint_id}": {"delete": {
        "operationId": "deleteWebhookEndpoint",
        "summary": "Delete an endpoint: it gets nothing more, its pending deliveries fail",
        "parameters": [{"name": "endpoint_id", "in": "path", "required": True, "schema": _STRING}],
        "responses": {"204": {"description": "deleted"},
                      **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, E.PAYLOAD_TOO_LARGE, *_DB)}}},
    "/v1/notifications": {"get": {
        "operationId": "listNotifications",
        "summary": "The owner's notifications, newest first, with each delivery's state",
        "parameters": [
            {"name": "job_id", "in": "query", "required": False,
             "schema": {"type": "string", "pattern": JOB_ID.pattern}},
            *_PAGE],
        "responses": {"200": _json("a page of notifications", {
            "type": "object", "additionalProperties": False, "required": ["notifications", "next_cursor"],
            "properties": {"notifications": {"type": "array",
                                             "items": {"$ref": "#/components/schemas/Notification"}},
                           "next_cursor": {"type": ["string", "null"]}}}),
            **_errors(E.INVALID_REQUEST, E.UNAUTHENTICATED, *_DB)}}},
    "/v1/notifications/{notification_id}/redeliver": {"post": {
        "operationId": "redeliverNotification",
        "summary": "Queue a delivered or failed notification again (the same id, a new 24 h)",
        "parameters": [{"name": "notification_id", "in": "path", "required": True, "schema": _STRING}],
        "responses": {"202": _json("the notification, its deliveries pending again",
                                   {"$ref": "#/components/schemas/Notification"}),
                      **_errors(E.UNAUTHENTICATED, E.NOT_FOUND, E.INVALID_STATE, E.PAYLOAD_TOO_LARGE, *_DB)}}},
    "/healthz": {"get": {"operationId": "healthz", "summary": "Liveness", "security": [],
                         "responses": {"200": _json("alive", {"$ref": "#/components/schemas/Health"})}}},
    "/readyz": {"get": {"operationId": "readyz", "summary": "Database reachable", "security": [],
                        "responses": {"200": _json("ready", {"$ref": "#/components/schemas/Health"}),
                                      "503": _json("database unreachable or not migrated",
                                                     {"$ref": "#/components/schemas/Health"})}}},
    "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics", "security": [],
                         "responses": {"200": {"description": "Prometheus text format",
                                               "content": {"text/plain": {"schema": _STRING}}}}}},
    "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document", "security": [],
                              "responses": {"200": _json("OpenAPI 3.1", {"type": "object"})}}},
    # The console is pages for a browser (app/web/console/), signed in with
    # ADMIN_TOKEN through a form: its entry is here, its pages are not API.
    "/console": {"get": {"operationId": "console", "summary": "The operator's console (HTML, for a browser)",
                         "security": [],
                         "responses": {"200": {"description": "the fleet page (signed in)",
                                               "content": {"text/html": {"schema": _STRING}}},
                                       "303": {"description": "not signed in: to /console/sign-in"},
                                       **_errors(E.NOT_FOUND)}}},
}



def _with_acting(paths: dict) -> dict:
    """Every owner-scoped operation takes Longcall-Owner, and may answer 404 for it."""
    acting_prefixes = ("/v1/jobs", "/v1/account", "/v1/webhook-endpoints", "/v1/notifications", "/v1/models")
    for path, operations in paths.items():
        if not path.startswith(acting_prefixes):
            continue
        for method, operation in operations.items():
            if method == "options":
                continue
            operation["parameters"] = [*operation.get("parameters", []), _ACTING]
            errors = operation["responses"].get("404")
            if errors is None:
                operation["responses"]["404"] = _errors(E.NOT_FOUND)["404"]
    return paths


PATHS = {**_with_acting(PATHS), **OWNER_PATHS}

DOCUMENT = {
    "openapi": "3.1.0",
    "info": {"title": "longcall", "version": "0.1.0",
             "description": "Durable, paid calls to external AI providers. Errors are "
                            '`{"error": {"code", "message"}}`; a 405 carries `Allow`.'},
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}, "schemas": SCHEMAS},
    "security": [{"bearer": []}],
    "paths": PATHS,
}


async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(DOCUMENT)
