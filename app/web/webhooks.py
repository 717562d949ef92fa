"""`POST /webhooks/{provider}/{job_id}` — the HTTP face of road 1
(outbox/roads/webhook.py). One uniform 401 for every failure, so the
endpoint tells a forger nothing."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app import ids
from app.vocabulary import ApiErrorCode
from app.web.body import MAX_BODY, TooLarge, read_capped
from app.web.errors import error_response
from outbox.roads import webhook as webhook_road

UNAUTHORIZED_BODY = {"error": {"code": ApiErrorCode.UNAUTHENTICATED, "message": "webhook not accepted"}}


async def receive_webhook(request: Request) -> Response:
    state = request.app.state
    provider_name = request.path_params["provider"]
    job_id = request.path_params["job_id"]
    provider = state.providers.get(provider_name)
    # A provider that never calls back has no webhook endpoint, as an unknown one.
    if provider is None or not provider.facts.takes_webhooks or not ids.is_job_id(job_id):
        return error_response(ApiErrorCode.NOT_FOUND, "no such webhook endpoint")
    try:
        raw = await read_capped(request, MAX_BODY)
    except TooLarge:
        state.metrics.webhook(provider_name, "too_large")
        return error_response(ApiErrorCode.PAYLOAD_TOO_LARGE, f"the webhook body is over {MAX_BODY} bytes")
    headers = {k.lower(): v for k, v in request.headers.items()}
    ok = await webhook_road.accept(state.pool, provider, state.secretbox, state.settings.secret_keys, job_id,
                                   headers, dict(request.query_params), raw)
    if not ok:
        state.metrics.webhook(provider_name, "unauthorized")
        return JSONResponse(UNAUTHORIZED_BODY, status_code=401)
    state.metrics.webhook(provider_name, "accepted")
    return Response(status_code=204)
