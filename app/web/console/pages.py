"""The console's pages (GET): the fleet, what needs a human, a job, owners,
search, and the confirmation pages in front of every action. Nothing here
changes state; app/web/console/actions.py does, behind a CSRF token."""
from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from app import ids, status
from app.domain import events, jobs, operator
from app.vocabulary import ALL_STATUSES, IN_FLIGHT, NEEDS_A_HUMAN, TERMINAL, ApiErrorCode, JobStatus
from app.web.console import forms
from app.web.console.render import HEADERS, page, static_file, wants_fragment
from app.web.console.session import Session, session_of, set_sign_in_cookie, sign_in_form_token
from app.web.errors import ApiError
from app.web.jobs import decode_cursor, encode_cursor, serve_output

ENTRY = "/console"
OWNERS_PER_PAGE = 50
JOBS_PER_PAGE = 25  # an owner's jobs
FINISHED_WINDOW_S = 3600  # the fleet counts what finished within the last hour
# What an action's redirect may say on the page it lands on (`?done=`): a
# fixed set, so nothing from the URL is ever shown as it is.
DONE = {
    "resolved": "Resolved with the task id: longcall asks the provider about that task and settles the job as usual.",
    "resolved_failed": "Resolved as failed: the job is closed and its credits refunded.",
    "redelivered": "Queued again: the deliveries below will be attempted anew.",
    "redelivered_none": "Nothing was queued: every delivery is still pending or its endpoint is gone.",
    "granted": "Granted: the credits are in the owner's balance.",
    "grant_replayed": "This grant was already made; nothing moved again.",
}

Handler = Callable[[Request, Session], Awaitable[Response]]


def require_console(request: Request) -> None:
    """No ADMIN_TOKEN: the console does not exist (the same 404 as any unknown route).
    create_app mounts no console route then; this second line keeps an empty
    token from ever being the one a sign-in compares against."""
    if not request.app.state.settings.admin_token:
        raise ApiError(ApiErrorCode.NOT_FOUND, "no such route")


def to_sign_in(request: Request) -> Response:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/sign-in?next={quote(forms.safe_next(here), safe='/')}",
                            status_code=303, headers=HEADERS)


def operator_page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        require_console(request)
        session = session_of(request)
        if session is None:
            if wants_fragment(request):  # console.js reloads, and lands on the sign-in form
                return Response(status_code=401, headers=HEADERS)
            if request.url.path == ENTRY:  # the address operators type: its page is the sign-in form
                return sign_in_form(request, ENTRY)
            return to_sign_in(request)
        return await handler(request, session)
    endpoint.__name__ = handler.__name__
    return endpoint


def message_page(request: Request, session: Session | None, title: str, message: str, status_code: int,
                 back: str = "/console") -> Response:
    return page(request, "message.html", {"title": title, "message": message, "back": back}, session=session,
                status_code=status_code)


def not_found_page(request: Request, session: Session | None, what: str) -> Response:
    return message_page(request, session, "Not found", f"There is no such {what}.", 404)


def done_message(request: Request) -> str | None:
    return DONE.get(request.query_params.get("done", ""))


@operator_page
async def fleet(request: Request, session: Session) -> Response:
    async with request.app.state.pool.acquire() as conn:
        screen = await status.collect(conn, request.app.state.caps, count_all_jobs=False)
        in_flight = await operator.in_flight_counts(conn)
        finished = await operator.finished_counts(conn, FINISHED_WINDOW_S)
        context = {
            "s": screen,
            "in_flight_counts": [(str(s), in_flight.get(s, 0)) for s in IN_FLIGHT],
            "finished_counts": [(str(s), finished.get(s, 0)) for s in TERMINAL],
            "in_flight": await operator.in_flight_jobs(conn),
            "recently_finished": await operator.recently_finished(conn),
            "failed_deliveries": await operator.failed_deliveries(conn),
            "needs_a_human": await operator.count_with_error(conn),
            "uncertain_count": in_flight.get(JobStatus.UNCERTAIN, 0),
            "now": screen["now"],
        }
    template = "_fleet_live.html" if wants_fragment(request) else "fleet.html"
    return page(request, template, context, session=session)


@operator_page
async def needs_a_human(request: Request, session: Session) -> Response:
    async with request.app.state.pool.acquire() as conn:
        closed = [(code, await operator.closed_with_error(conn, code)) for code in NEEDS_A_HUMAN]
        context = {
            "uncertain_jobs": await operator.uncertain_jobs(conn),
            "closed": closed,
            "counts": await operator.count_with_error(conn),
            "now": await conn.fetchval("select now()"),
        }
    return page(request, "needs_a_human.html", context, session=session)


@operator_page
async def job(request: Request, session: Session) -> Response:
    job_id = request.path_params["job_id"]
    if not ids.is_job_id(job_id):
        return not_found_page(request, session, "job")
    async with request.app.state.pool.acquire() as conn:
        found = await operator.job(conn, job_id)
        if found is None:
            return not_found_page(request, session, "job")
        timeline = await events.timeline(conn, job_id)
        now = await conn.fetchval("select now()")
    return page(request, "job.html", {**found, "timeline": timeline, "now": now,
                                      "done": done_message(request),
                                      "is_uncertain": found["job"]["status"] == JobStatus.UNCERTAIN},
                session=session)


@operator_page
async def job_output(request: Request, session: Session) -> Response:
    job_id = request.path_params["job_id"]
    row = await jobs.get_job(request.app.state.pool, job_id) if ids.is_job_id(job_id) else None
    if row is None:
        return not_found_page(request, session, "job")
    return await serve_output(request, job_id, row["outputs"], request.path_params["index"], {})


@operator_page
async def confirm_resolve(request: Request, session: Session) -> Response:
    job_id = request.path_params["job_id"]
    if not ids.is_job_id(job_id):
        return not_found_page(request, session, "job")
    try:
        resolution = forms.parse_resolution(dict(request.query_params))
    except forms.FormError as e:
        return message_page(request, session, "Cannot resolve", str(e), 400, back=f"/console/jobs/{job_id}")
    async with request.app.state.pool.acquire() as conn:
        found = await operator.job(conn, job_id)
    if found is None:
        return not_found_page(request, session, "job")
    if found["job"]["status"] != JobStatus.UNCERTAIN:
        # A stale tab or a typed URL: no confirmation of what would be refused.
        return message_page(request, session, "Cannot resolve",
                            f"Only an uncertain job can be resolved; this one is {found['job']['status']}.", 409,
                            back=f"/console/jobs/{job_id}")
    return page(request, "confirm_resolve.html", {"job": found["job"], "resolution": resolution},
                session=session)


@operator_page
async def owners(request: Request, session: Session) -> Response:
    cursor = request.query_params.get("cursor")
    try:
        after = decode_cursor(cursor, ids.is_owner_id) if cursor else None
    except ApiError:
        after = None
    async with request.app.state.pool.acquire() as conn:
        rows = await operator.owners(conn, limit=OWNERS_PER_PAGE + 1, after=after)
    shown = rows[:OWNERS_PER_PAGE]
    more = encode_cursor(shown[-1]) if len(rows) > OWNERS_PER_PAGE else None
    return page(request, "owners.html", {"owners": shown, "next_cursor": more}, session=session)


@operator_page
async def owner(request: Request, session: Session) -> Response:
    owner_id = request.path_params["owner_id"]
    if not ids.is_owner_id(owner_id):
        return not_found_page(request, session, "owner")
    # Its jobs, newest first, a page at a time, optionally of one status (the
    # owner's own list statement: GET /v1/jobs).
    wanted = request.query_params.get("status") or None
    status_filter = wanted if wanted in ALL_STATUSES else None
    cursor = request.query_params.get("cursor")
    try:
        after = decode_cursor(cursor) if cursor else None
    except ApiError:
        after = None
    async with request.app.state.pool.acquire() as conn:
        found = await operator.owner(conn, owner_id)
        if found is None:
            return not_found_page(request, session, "owner")
        shown, more_jobs = await jobs.list_jobs(conn, owner_id, status=status_filter, limit=JOBS_PER_PAGE,
                                                after=after)
    more = encode_cursor(shown[-1]) if more_jobs else None
    # The grant's one-time key is made here, with the form, and rides in the
    # confirmation page's URL: that page loaded again (Back, a reload) keeps
    # it, so confirming twice moves the money once.
    return page(request, "owner.html", {**found, "jobs": shown, "next_cursor": more, "status_filter": status_filter,
                                        "statuses": [str(s) for s in ALL_STATUSES], "done": done_message(request),
                                        "grant_key": new_grant_key()},
                session=session)


def new_grant_key() -> str:
    return "console-" + secrets.token_hex(16)


@operator_page
async def confirm_grant(request: Request, session: Session) -> Response:
    owner_id = request.path_params["owner_id"]
    if not ids.is_owner_id(owner_id):
        return not_found_page(request, session, "owner")
    try:
        grant = forms.parse_grant(dict(request.query_params))
    except forms.FormError as e:
        return message_page(request, session, "Cannot grant", str(e), 400, back=f"/console/owners/{owner_id}")
    async with request.app.state.pool.acquire() as conn:
        found = await operator.owner(conn, owner_id, grants=0)
    if found is None:
        return not_found_page(request, session, "owner")
    # The grant's one-time key, from the owner page's form: submitting this
    # page twice, or again after loading it again, moves the money once.
    if "grant_key" in request.query_params:
        try:
            key = forms.parse_grant_key(request.query_params["grant_key"])
        except forms.FormError as e:
            return message_page(request, session, "Cannot grant", str(e), 400, back=f"/console/owners/{owner_id}")
    else:
        key = new_grant_key()
    return page(request, "confirm_grant.html", {"owner": found["owner"], "wanted": grant, "grant_key": key},
                session=session)


@operator_page
async def search(request: Request, session: Session) -> Response:
    raw = request.query_params.get("q")
    try:
        wanted = forms.parse_search(raw)
    except forms.FormError as e:
        return page(request, "search.html", {"q": raw, "error": str(e), "results": [], "kind": None}, session=session,
                    status_code=400)
    if wanted is None:
        return page(request, "search.html", {"q": "", "error": None, "results": [], "kind": None}, session=session)
    async with request.app.state.pool.acquire() as conn:
        if wanted.kind == "job" and await jobs.get_job(conn, wanted.value) is not None:
            return RedirectResponse(f"/console/jobs/{wanted.value}", status_code=303, headers=HEADERS)
        if wanted.kind == "owner" and await operator.owner(conn, wanted.value, grants=0):
            return RedirectResponse(f"/console/owners/{wanted.value}", status_code=303, headers=HEADERS)
        if wanted.kind == "notification":
            found = await operator.notification_owner(conn, wanted.value)
            if found is not None:
                return RedirectResponse(f"/console/jobs/{found['job_id']}", status_code=303, headers=HEADERS)
        results = await operator.jobs_by_task(conn, wanted.value) if wanted.kind == "task" else []
    return page(request, "search.html", {"q": wanted.value, "error": None, "results": results,
                                         "kind": wanted.kind}, session=session)


def sign_in_form(request: Request, target: str, *, error: str | None = None, status_code: int = 200) -> Response:
    token, new_cookie = sign_in_form_token(request)
    response = page(request, "sign_in.html", {"next": target, "form_token": token, "error": error},
                    session=None, status_code=status_code)
    if new_cookie is not None:
        set_sign_in_cookie(request, response, new_cookie)
    return response


async def sign_in_page(request: Request) -> Response:
    require_console(request)
    target = forms.safe_next(request.query_params.get("next"))
    if session_of(request) is not None:
        return RedirectResponse(target, status_code=303, headers=HEADERS)
    return sign_in_form(request, target)


async def static(request: Request) -> Response:
    require_console(request)
    found = static_file(request.path_params["name"], request.query_params.get("v"))
    if found is None:
        raise ApiError(ApiErrorCode.NOT_FOUND, "no such route")
    return found

