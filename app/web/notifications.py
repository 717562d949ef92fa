"""Notification routes: an owner's endpoints, its notifications, redeliver
(CONTRACT.md: Notifications to the client). Sending is the settler's
(outbox/notify.py); the URL rule is app/delivery.py's."""
from __future__ import annotations

import datetime as dt
import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app import delivery, ids
from app.domain import notifications
from app.jobjson import iso
from app.vocabulary import DEFAULT_EVENTS, ApiErrorCode, NotificationType
from app.web.auth import require_owner
from app.web.body import MAX_LIST_LIMIT, invalid, query_value, read_body, read_json_object
from app.web.errors import ApiError, not_found
from app.web.jobs import decode_cursor, encode_cursor, page_limit, refuse_unknown_parameters

ENDPOINT_FIELDS = ("url", "events")
EVENT_NAMES = tuple(NotificationType)


def _endpoint_json(endpoint: notifications.Endpoint) -> dict:
    return {"id": endpoint.id, "url": endpoint.url, "events": endpoint.events,
            "created_at": iso(endpoint.created_at)}


def _events(body: dict) -> list[str]:
    if "events" not in body or body["events"] is None:
        return list(DEFAULT_EVENTS)
    events = body["events"]
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise invalid(f"events must be a non-empty list of event names: {', '.join(EVENT_NAMES)}")
    unknown = [e for e in events if e not in EVENT_NAMES]
    if unknown:
        raise invalid(f"unknown event {json.dumps(unknown[0][:40])}; known: {', '.join(EVENT_NAMES)}")
    return list(dict.fromkeys(events))  # each once, in the order given


async def create_endpoint(request: Request) -> Response:
    owner_id = await require_owner(request)
    body = await read_json_object(request)
    unknown = sorted(set(body) - set(ENDPOINT_FIELDS))
    if unknown:
        raise invalid(f"unknown field(s): {', '.join(json.dumps(n[:40]) for n in unknown[:5])}")
    url = body.get("url")
    if not isinstance(url, str):
        raise invalid("url must be a string")
    events = _events(body)
    allowed = request.app.state.settings.notify_allowed_origins
    try:
        parsed = delivery.check_endpoint_url(url, allowed)
        await delivery.check_resolved(parsed, allowed, request.app.state.endpoint_resolver)
    except delivery.EndpointRefused as e:
        raise invalid(str(e)) from None
    endpoint_id = ids.new_endpoint_id()
    secret = delivery.new_secret()
    sealed = request.app.state.secretbox.encrypt(secret, endpoint_id)
    pool = request.app.state.pool
    async with pool.acquire() as conn, conn.transaction():
        if await notifications.count_endpoints_locked(conn, owner_id) >= notifications.MAX_ENDPOINTS_PER_OWNER:
            raise invalid(f"an owner may have at most {notifications.MAX_ENDPOINTS_PER_OWNER} endpoints")
        endpoint = await notifications.create_endpoint(conn, endpoint_id=endpoint_id, owner_id=owner_id,
                                                       url=url, events=events, encrypted_secret=sealed)
    # The secret is shown here, once; it is stored only encrypted.
    return JSONResponse({**_endpoint_json(endpoint), "secret": secret}, status_code=201)


async def list_endpoints(request: Request) -> Response:
    owner_id = await require_owner(request)
    async with request.app.state.pool.acquire() as conn:
        endpoints = await notifications.list_endpoints(conn, owner_id)
    return JSONResponse({"webhook_endpoints": [_endpoint_json(e) for e in endpoints]})


async def delete_endpoint(request: Request) -> Response:
    owner_id = await require_owner(request)
    await read_body(request)  # none is taken, but one over the cap is refused (413), changing nothing
    endpoint_id = request.path_params["endpoint_id"]
    if not ids.is_endpoint_id(endpoint_id):
        raise not_found("webhook endpoint")
    async with request.app.state.pool.acquire() as conn:
        if not await notifications.delete_endpoint(conn, endpoint_id, owner_id):
            raise not_found("webhook endpoint")
    return Response(status_code=204)


def _notification_json(row) -> dict:
    deliveries = [{"endpoint_id": d["endpoint_id"], "status": d["status"], "attempts": d["attempts"],
                   "last_status_code": d["last_status_code"],
                   "last_attempt_at": iso(dt.datetime.fromisoformat(d["last_attempt_at"]))
                   if d["last_attempt_at"] else None}
                  for d in row["deliveries"]]
    return {"id": row["id"], "type": row["type"], "job_id": row["job_id"], "created_at": iso(row["created_at"]),
            "deliveries": deliveries}


async def list_notifications(request: Request) -> Response:
    owner_id = await require_owner(request)
    refuse_unknown_parameters(request, {"job_id", "limit", "cursor"})
    job_id = query_value(request, "job_id")
    if job_id is not None and not ids.is_job_id(job_id):
        raise invalid("job_id must be a job id (job_ and 24 hex digits)")
    limit = page_limit(request, default=20, maximum=MAX_LIST_LIMIT)
    cursor = query_value(request, "cursor")
    after = decode_cursor(cursor, ids.is_notification_id) if cursor else None
    async with request.app.state.pool.acquire() as conn:
        rows = await notifications.list_notifications(conn, owner_id, job_id=job_id, limit=limit + 1, after=after)
    page = rows[:limit]
    return JSONResponse({"notifications": [_notification_json(r) for r in page],
                         "next_cursor": encode_cursor(page[-1]) if len(rows) > limit else None})


async def redeliver(request: Request) -> Response:
    owner_id = await require_owner(request)
    await read_body(request)  # none is taken, but one over the cap is refused (413), changing nothing
    notification_id = request.path_params["notification_id"]
    if not ids.is_notification_id(notification_id):
        raise not_found("notification")
    async with request.app.state.pool.acquire() as conn:
        requeued = await notifications.redeliver(conn, notification_id, owner_id)
        if requeued is None:
            raise not_found("notification")
        if requeued == 0:
            raise ApiError(ApiErrorCode.INVALID_STATE, "nothing to redeliver: each delivery is still pending "
                                                       "or its endpoint was deleted")
        row = await notifications.get_notification(conn, owner_id, notification_id)
    return JSONResponse(_notification_json(row), status_code=202)
