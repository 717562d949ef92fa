"""The console's actions (POST): sign in, sign out, and the three things an
operator changes — resolve an uncertain job, grant credits, redeliver a
notification. Each is an existing domain operation (app/domain/recovery.py,
owners.operator_grant, notifications.redeliver); the console adds no new
way to move money.

Before any of them touches the database: the console must exist (ADMIN_TOKEN
set), the body must be a small urlencoded form, the session cookie must be
good and the form must carry that session's CSRF token. Anything else is
refused and changes nothing. After an action, a 303 to the page that shows
its result (post/redirect/get: a reload does not repeat it)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from app import ids
from app.domain import notifications, operator, owners, recovery
from app.web.body import TooLarge, read_capped
from app.web.console import forms
from app.web.console.pages import message_page, require_console, sign_in_form, to_sign_in
from app.web.console.render import HEADERS
from app.web.console.session import (
    CSRF_FIELD,
    Session,
    action_token_ok,
    admin_token_matches,
    end_session,
    session_of,
    sign_in_token_ok,
    start_session,
)

Action = Callable[[Request, Session, dict[str, str]], Awaitable[Response]]


def refused(request: Request, session: Session | None, message: str, status_code: int) -> Response:
    return message_page(request, session, "Refused — nothing was changed", message, status_code)


async def read_form(request: Request) -> dict[str, str]:
    try:
        raw = await read_capped(request, forms.MAX_FORM_BYTES)
    except TooLarge:
        raise forms.FormError(f"The form is over {forms.MAX_FORM_BYTES // 1024} KiB.", 413) from None
    return forms.parse_form(request.headers.get("content-type"), raw)


def operator_action(handler: Action) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        require_console(request)
        session = session_of(request)
        if session is None:
            return to_sign_in(request)
        try:
            fields = await read_form(request)
        except forms.FormError as e:
            return refused(request, session, str(e), e.status_code)
        if not action_token_ok(request, session, fields.get(CSRF_FIELD)):
            return refused(request, session, "This form did not come from this console session (its CSRF "
                                             "token is missing or wrong). Reload the page and try again.", 403)
        return await handler(request, session, fields)
    endpoint.__name__ = handler.__name__
    return endpoint


def see(path: str) -> Response:
    return RedirectResponse(path, status_code=303, headers=HEADERS)


async def sign_in(request: Request) -> Response:
    require_console(request)
    try:
        fields = await read_form(request)
    except forms.FormError as e:
        return refused(request, None, str(e), e.status_code)
    target = forms.safe_next(fields.get("next"))
    if not sign_in_token_ok(request, fields.get(CSRF_FIELD)):
        return sign_in_form(request, target, error="This sign-in form has expired or did not come from "
                                                   "this console. Try again.", status_code=403)
    given = fields.get("token", "")
    if len(given) > forms.MAX_ADMIN_TOKEN or not admin_token_matches(given, request.app.state.settings.admin_token):
        return sign_in_form(request, target, error="That is not the admin token.", status_code=401)
    response = see(target)
    start_session(request, response)
    return response


@operator_action
async def sign_out(request: Request, session: Session, fields: dict[str, str]) -> Response:
    response = see("/console/sign-in")
    end_session(request, response)
    return response


@operator_action
async def resolve(request: Request, session: Session, fields: dict[str, str]) -> Response:
    job_id = request.path_params["job_id"]
    back = f"/console/jobs/{job_id}"
    if not ids.is_job_id(job_id):
        return refused(request, session, "There is no such job.", 404)
    try:
        resolution = forms.parse_resolution(fields)
    except forms.FormError as e:
        return refused(request, session, str(e), e.status_code)
    try:
        async with request.app.state.pool.acquire() as conn:
            if resolution.task_id is not None:
                await recovery.resolve_with_task(conn, job_id, resolution.task_id)
            else:
                await recovery.resolve_failed(conn, job_id, request.app.state.settings)
    except LookupError:
        return refused(request, session, "There is no such job.", 404)
    except recovery.InvalidState as e:
        return refused(request, session, f"Only an uncertain job can be resolved; this one is {e}.", 409)
    return see(back + ("?done=resolved" if resolution.task_id is not None else "?done=resolved_failed"))


@operator_action
async def grant(request: Request, session: Session, fields: dict[str, str]) -> Response:
    owner_id = request.path_params["owner_id"]
    try:
        wanted = forms.parse_grant(fields)
        key = forms.parse_grant_key(fields.get("grant_key"))
    except forms.FormError as e:
        return refused(request, session, str(e), e.status_code)
    try:
        async with request.app.state.pool.acquire() as conn:
            moved = await owners.operator_grant(conn, owner_id, credits=wanted.credits, reason=wanted.reason,
                                                request_key=key)
    except owners.NotFound:
        return refused(request, session, "There is no such owner.", 404)
    except owners.IdempotencyConflict:
        return refused(request, session, "This confirmation was already used for another grant. "
                                         "Start again from the owner's page.", 409)
    return see(f"/console/owners/{owner_id}?done=" + ("granted" if moved else "grant_replayed"))


@operator_action
async def redeliver(request: Request, session: Session, fields: dict[str, str]) -> Response:
    notification_id = request.path_params["notification_id"]
    if not ids.is_notification_id(notification_id):
        return refused(request, session, "There is no such notification.", 404)
    async with request.app.state.pool.acquire() as conn:
        found = await operator.notification_owner(conn, notification_id)
        if found is None:
            return refused(request, session, "There is no such notification.", 404)
        # As its owner's platform if it has one (it sees every delivery:
        # its owners' endpoints and its own), else as its owner.
        requeued = await notifications.redeliver(conn, notification_id, found["platform_id"] or found["owner_id"])
    return see(f"/console/jobs/{found['job_id']}?done=" + ("redelivered" if requeued else "redelivered_none"))

