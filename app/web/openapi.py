"""The API's OpenAPI document (served at /openapi.json), written by hand so
it says exactly what CONTRACT.md says."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

_ERROR = {"$ref": "#/components/schemas/Error"}
_JOB = {"$ref": "#/components/schemas/Job"}


def _resp(description: str, schema: dict | None = None) -> dict:
    r: dict = {"description": description}
    if schema:
        r["content"] = {"application/json": {"schema": schema}}
    return r


def _errors(*codes: int) -> dict:
    return {str(c): _resp("error", _ERROR) for c in codes}


_JOB_ID = {"name": "job_id", "in": "path", "required": True,
           "schema": {"type": "string", "pattern": "^job_[0-9a-f]{24}$"}}

DOCUMENT = {
    "openapi": "3.1.0",
    "info": {"title": "longcall", "version": "0.1.0",
             "description": "Durable, paid calls to external AI providers."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "enum": [
                    "unauthenticated", "not_found", "invalid_request", "payload_too_large",
                    "unknown_provider", "insufficient_credits", "capacity_exhausted",
                    "idempotency_conflict", "invalid_state"]},
                    "message": {"type": "string"}}}}},
            "CreateJob": {"type": "object", "additionalProperties": False,
                          "required": ["provider", "model", "input", "max_credits"],
                          "properties": {"provider": {"type": "string", "enum": ["sim", "replicate", "fal", "kie"]},
                                         "model": {"type": "string", "minLength": 1, "maxLength": 200},
                                         "input": {"type": "object"},
                                         "max_credits": {"type": "integer", "minimum": 1}}},
            "Output": {"type": "object", "properties": {
                "index": {"type": "integer"}, "url": {"type": "string"},
                "content_type": {"type": ["string", "null"]}, "bytes": {"type": "integer"},
                "sha256": {"type": "string"}}},
            "Job": {"type": "object", "properties": {
                "id": {"type": "string"},
                "status": {"type": "string", "enum": ["queued", "submitting", "running", "uncertain",
                                                      "succeeded", "failed", "cancelled", "expired"]},
                "provider": {"type": "string"}, "model": {"type": "string"}, "input": {"type": "object"},
                "created_at": {"type": "string", "format": "date-time"},
                "updated_at": {"type": "string", "format": "date-time"},
                "finished_at": {"type": ["string", "null"], "format": "date-time"},
                "credits": {"type": "object", "properties": {
                    "reserved": {"type": "integer"}, "charged": {"type": "integer"},
                    "refunded": {"type": "integer"}}},
                "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/Output"}},
                "error": {"type": ["object", "null"], "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"}}},
                "status_url": {"type": "string"}}},
            "Account": {"type": "object", "properties": {
                "owner_id": {"type": "string"},
                "credits": {"type": "object", "properties": {
                    "balance": {"type": "integer"}, "reserved": {"type": "integer"},
                    "charged": {"type": "integer"}}},
                "active": {"type": "integer"}, "max_active": {"type": "integer"}}},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/jobs": {
            "post": {"summary": "Create a job (no provider call happens in this request)",
                     "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                                     "schema": {"type": "string", "maxLength": 255}}],
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/CreateJob"}}}},
                     "responses": {"202": _resp("created", _JOB), "200": _resp("replay of the same request", _JOB),
                                   **_errors(400, 401, 402, 409, 413, 422, 429)}},
            "get": {"summary": "The owner's jobs, newest first",
                    "parameters": [{"name": "status", "in": "query", "schema": {"type": "string"}},
                                   {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                                   {"name": "cursor", "in": "query", "schema": {"type": "string"}}],
                    "responses": {"200": _resp("a page of jobs", {"type": "object", "properties": {
                        "jobs": {"type": "array", "items": _JOB},
                        "next_cursor": {"type": ["string", "null"]}}}), **_errors(400, 401)}},
        },
        "/v1/jobs/{job_id}": {"get": {
            "summary": "Read a job (API key, or its read token)",
            "security": [{"bearer": []}, {}],
            "parameters": [_JOB_ID,
                           {"name": "token", "in": "query", "schema": {"type": "string"}},
                           {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 30}}],
            "responses": {"200": _resp("the job", _JOB), **_errors(400, 401, 404)}}},
        "/v1/jobs/{job_id}/cancel": {"post": {
            "summary": "Cancel a job not yet terminal (refunded in this request)",
            "parameters": [_JOB_ID],
            "responses": {"200": _resp("the cancelled job", _JOB), **_errors(401, 404, 409)}}},
        "/v1/jobs/{job_id}/outputs/{index}": {"get": {
            "summary": "An output's bytes (or a redirect to a short-lived URL)",
            "security": [{"bearer": []}, {}],
            "parameters": [_JOB_ID, {"name": "index", "in": "path", "required": True, "schema": {"type": "integer"}},
                           {"name": "token", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": _resp("the bytes"), "302": _resp("presigned URL"), **_errors(401, 404)}}},
        "/v1/account": {"get": {"summary": "The owner's credits and capacity",
                                "responses": {"200": _resp("account", {"$ref": "#/components/schemas/Account"}),
                                              **_errors(401)}}},
        "/webhooks/{provider}/{job_id}": {"post": {
            "summary": "Provider webhooks, verified at arrival", "security": [],
            "parameters": [{"name": "provider", "in": "path", "required": True, "schema": {"type": "string"}}, _JOB_ID],
            "responses": {"204": _resp("accepted"), **_errors(401, 404, 413)}}},
        "/v1/admin/jobs/{job_id}/resolve": {"post": {
            "summary": "Resolve an uncertain job (ADMIN_TOKEN)", "parameters": [_JOB_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": [
                {"type": "object", "required": ["provider_task_id"], "properties": {"provider_task_id": {"type": "string"}}},
                {"type": "object", "required": ["outcome"], "properties": {"outcome": {"const": "failed"}}}]}}}},
            "responses": {"200": _resp("the job", _JOB), **_errors(400, 401, 404, 409)}}},
        "/healthz": {"get": {"summary": "Liveness", "security": [], "responses": {"200": _resp("alive")}}},
        "/readyz": {"get": {"summary": "Database reachable", "security": [],
                            "responses": {"200": _resp("ready"), "503": _resp("database unreachable")}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": _resp("text format")}}},
    },
}


async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(DOCUMENT)
