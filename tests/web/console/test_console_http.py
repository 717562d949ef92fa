"""The operator's console over plain HTTP (app/web/console/): that it does
not exist without ADMIN_TOKEN, who gets in, what every response carries,
that no form works without its CSRF token, that each action does what it
says once, and that no page shows a secret. The same pages in a real
browser: test_browser.py."""
from __future__ import annotations

import asyncio
import html
import re
import time

import httpx
import pytest

from app.jobjson import read_token
from app.signing.tokens import make_session_token
from app.web.console.session import SESSION_COOKIE, SESSION_TTL_S
from tests.support.console import ADMIN_TOKEN, Console, csrf_of, hidden_fields, make_uncertain

SECRET_KEY = b"test-secret-key-0123456789"  # tests/conftest.py's SECRET_KEY
JOB_BODY = {"provider": "sim", "model": "image-fast", "input": {"duration_s": 1}, "max_credits": 25}
PROVIDER_SECRETS = {"REPLICATE_API_TOKEN": "r8_console_secret_token", "FAL_KEY": "fal-console-secret-key",
                    "KIE_API_KEY": "kie-console-secret-key", "ANTHROPIC_API_KEY": "sk-ant-console-secret",
                    "OPENAI_API_KEY": "sk-openai-console-secret"}
NOT_A_JOB = "job_" + "0" * 24


async def new_job(server, api_key: str, **overrides) -> dict:
    async with server.client(api_key) as c:
        answer = await c.post("/v1/jobs", json={**JOB_BODY, **overrides})
    assert answer.status_code == 202, answer.text
    return answer.json()


async def job_row(db, job_id: str):
    return await db.fetchrow("select status, provider_task_id, credits_reserved, credits_charged, credits_refunded, "
                             "error_code from jobs where id = $1", job_id)


async def money(db, owner_id: str) -> tuple:
    row = await db.fetchrow("select granted, balance, reserved, charged from owners where id = $1", owner_id)
    grants = await db.fetchval("select count(*) from ledger where owner_id = $1 and kind = 'grant'", owner_id)
    return (*row, grants)


def signed_out(answer: httpx.Response) -> bool:
    """The answer a browser without a session gets: the sign-in form (at
    /console itself) or a redirect to it (every other page), never the page."""
    if answer.request.url.path == "/console" and answer.status_code == 200:
        return 'action="/console/sign-in"' in answer.text and "<h1>Fleet</h1>" not in answer.text
    return answer.status_code == 303 and answer.headers["location"].startswith("/console/sign-in?next=/console")


def page_paths(job_id: str, owner_id: str) -> list[str]:
    return ["/console", "/console/needs-a-human", f"/console/jobs/{job_id}", "/console/owners",
            f"/console/owners/{owner_id}", f"/console/search?q={job_id}", "/console/search?q=some-task",
            f"/console/jobs/{job_id}/resolve?outcome=failed", f"/console/jobs/{job_id}/resolve?task_id=t-1",
            f"/console/owners/{owner_id}/grant?credits=5", f"/console/jobs/{job_id}/outputs/0"]


@pytest.fixture
async def uncertain(web, make_owner, db):
    """(the web app, an owner, one of its jobs left uncertain)."""
    server = await web()
    owner = await make_owner()
    job = await new_job(server, owner.api_key)
    await make_uncertain(db, job["id"])
    return server, owner, job


# --- no ADMIN_TOKEN: no console -------------------------------------------------------


async def test_without_admin_token_everything_under_console_is_the_api_404(web):
    server = await web(ADMIN_TOKEN="")
    async with httpx.AsyncClient(base_url=server.url) as c:
        unknown = await c.get("/no/such/route")
        answers = [
            await c.get("/console"), await c.get("/console/sign-in"), await c.get("/console/needs-a-human"),
            await c.get("/console/static/console.css"), await c.get("/console/static/console.js"),
            await c.get(f"/console/jobs/{NOT_A_JOB}"), await c.get("/console/anything/else"),
            await c.post("/console/sign-in", data={"token": "", "csrf": ""}),
            await c.post("/console/sign-out"), await c.post(f"/console/jobs/{NOT_A_JOB}/resolve"),
            # Methods the console does not take: the same 404, not a 405 that tells the route is there.
            await c.delete("/console"), await c.get("/console/sign-out"), await c.put("/console/sign-in"),
        ]
    assert unknown.status_code == 404
    for answer in answers:
        assert (answer.status_code, answer.json()) == (404, unknown.json()), answer.request.url
        assert "set-cookie" not in answer.headers


# --- signing in ----------------------------------------------------------------------


async def test_every_page_and_action_needs_a_session(uncertain, db):
    server, owner, job = uncertain
    async with Console(server.url) as console:
        for path in page_paths(job["id"], owner.owner_id):
            assert signed_out(await console.http.get(path)), path
        entry = await console.http.get("/console")
        assert entry.status_code == 200 and 'name="next" value="/console"' in entry.text
        fragment = await console.http.get("/console", headers={"X-Console-Fragment": "1"})
        assert fragment.status_code == 401 and fragment.text == ""
        for path, data in ((f"/console/jobs/{job['id']}/resolve", {"outcome": "failed"}),
                           (f"/console/owners/{owner.owner_id}/grant",
                            {"credits": "5", "grant_key": "console-" + "0" * 32}),
                           ("/console/sign-out", {})):
            answer = await console.http.post(path, data=data)
            assert answer.status_code == 303 and answer.headers["location"].startswith("/console/sign-in"), path
    assert (await job_row(db, job["id"]))["status"] == "uncertain"
    assert await money(db, owner.owner_id) == (1000, 975, 25, 0, 1)


async def test_sign_in_with_the_admin_token_sets_a_strict_httponly_session_cookie(web):
    server = await web()
    async with Console(server.url) as console:
        wrong = await console.sign_in(token="not-the-token")
        assert wrong.status_code == 401 and "That is not the admin token." in wrong.text
        assert SESSION_COOKIE not in console.http.cookies
        assert "not-the-token" not in wrong.text
        right = await console.sign_in(next="/console/owners")
        assert right.status_code == 303 and right.headers["location"] == "/console/owners"
        cookie = next(c for c in right.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
        attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
        assert {"httponly", "samesite", "path", "max-age"} <= attributes
        assert "secure" not in attributes  # plain http on loopback: a Secure cookie would never come back
        assert "samesite=strict" in cookie.lower() and "path=/console" in cookie.lower()
        assert f"max-age={SESSION_TTL_S}" in cookie.lower()
        assert "<h1>Owners</h1>" in await console.page("/console/owners")
        # Signed in, the sign-in page sends you on.
        again = await console.http.get("/console/sign-in?next=/console/needs-a-human")
        assert again.status_code == 303 and again.headers["location"] == "/console/needs-a-human"


@pytest.mark.parametrize("size", [17_000, 2_000_000], ids=["over the form cap", "over the 1 MiB body cap"])
async def test_a_form_over_its_cap_is_413_signed_in_or_not(size, web):
    """Not the 500 `internal` of an uncaught TooLarge (CONTRACT: never for any input)."""
    server = await web()
    body = b"token=" + b"a" * size
    headers = {"content-type": "application/x-www-form-urlencoded"}
    async with Console(server.url) as console:
        before = await console.http.post("/console/sign-in", content=body, headers=headers)
        await console.sign_in()
        after = await console.http.post("/console/sign-out", content=body, headers=headers)
        assert console.http.cookies.get(SESSION_COOKIE)  # still signed in: nothing changed
    for answer in (before, after):
        assert answer.status_code == 413 and "The form is over 16 KiB." in answer.text


async def test_the_session_cookie_is_secure_behind_a_trusted_https_proxy(web):
    # uvicorn trusts X-Forwarded-Proto from FORWARDED_ALLOW_IPS (default
    # 127.0.0.1): the test client is that proxy here.
    server = await web()
    https = {"X-Forwarded-Proto": "https"}
    async with httpx.AsyncClient(base_url=server.url, headers=https) as c:
        form = await c.get("/console/sign-in")
        (sign_in_cookie,) = form.headers.get_list("set-cookie")
        assert "; secure" in sign_in_cookie.lower()
        # httpx keeps a Secure cookie for https only: sent by hand, as the browser behind the proxy would.
        signed_in = await c.post("/console/sign-in", data={"csrf": csrf_of(form.text), "next": "/console",
                                                           "token": ADMIN_TOKEN},
                                 headers={"Cookie": sign_in_cookie.split(";")[0]})
    assert signed_in.status_code == 303
    cookie = next(c for c in signed_in.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
    assert "; secure" in cookie.lower()


@pytest.mark.parametrize("case", ["no-token", "wrong-token", "other-browser's-token", "action-token"])
async def test_a_sign_in_without_its_forms_token_is_refused(web, case):
    server = await web()
    async with Console(server.url) as console, Console(server.url) as other:
        form = await console.http.get("/console/sign-in")
        fields = {"token": ADMIN_TOKEN, "next": "/console"}
        if case == "wrong-token":
            fields["csrf"] = csrf_of(form.text)[:-2] + "AA"
        elif case == "other-browser's-token":
            fields["csrf"] = csrf_of((await other.http.get("/console/sign-in")).text)
        elif case == "action-token":
            await other.sign_in()
            fields["csrf"] = csrf_of(await other.page("/console"))
        answer = await console.http.post("/console/sign-in", data=fields)
        assert answer.status_code == 403 and "has expired or did not come from this console" in answer.text
        assert SESSION_COOKIE not in console.http.cookies
        assert signed_out(await console.http.get("/console"))


async def test_sign_in_returns_only_to_a_console_page(web):
    server = await web()
    for target in ("//evil.example/", "https://evil.example/console", "/v1/account", "/console/..//evil"):
        async with Console(server.url) as console:
            answer = await console.sign_in(next=target)
            assert (answer.status_code, answer.headers["location"]) == (303, "/console"), target


@pytest.mark.parametrize("case", ["tampered", "expired", "other-admin-token", "other-secret-key", "garbage"])
async def test_a_session_cookie_that_is_not_good_is_no_session(web, case):
    server = await web()
    now = int(time.time())
    nonce = bytes(16)
    cookie = {
        "tampered": make_session_token(SECRET_KEY, ADMIN_TOKEN, nonce, now + 600)[:-3] + "AAA",
        "expired": make_session_token(SECRET_KEY, ADMIN_TOKEN, nonce, now - 1),
        "other-admin-token": make_session_token(SECRET_KEY, "an-earlier-admin-token", nonce, now + 600),
        "other-secret-key": make_session_token(b"another-secret-key-0123", ADMIN_TOKEN, nonce, now + 600),
        "garbage": "not a token",
    }[case]
    good = make_session_token(SECRET_KEY, ADMIN_TOKEN, nonce, now + 600)
    async with httpx.AsyncClient(base_url=server.url) as c:
        control = await c.get("/console", headers={"Cookie": f"{SESSION_COOKIE}={good}"})
        assert control.status_code == 200
        answer = await c.get("/console/owners", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
        entry = await c.get("/console", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
    assert signed_out(answer) and signed_out(entry)


async def test_sign_out_clears_the_cookie(web):
    server = await web()
    async with Console(server.url) as console:
        await console.sign_in()
        answer = await console.submit("/console", "/console/sign-out")
        assert answer.status_code == 303 and answer.headers["location"] == "/console/sign-in"
        cleared = next(c for c in answer.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "="))
        assert "max-age=0" in cleared.lower()
        assert SESSION_COOKIE not in console.http.cookies
        assert signed_out(await console.http.get("/console"))


# --- what every response carries ----------------------------------------------------

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
INLINE_STYLE = re.compile(r"<style\b|\sstyle\s*=", re.I)
INLINE_HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)


async def test_every_console_response_has_a_strict_csp_and_no_inline_code(uncertain, db):
    server, owner, job = uncertain
    async with Console(server.url) as console:
        answers = [await console.http.get("/console/sign-in"), await console.sign_in()]
        for path in page_paths(job["id"], owner.owner_id)[:-1]:
            answers.append(await console.http.get(path))
        answers.append(await console.http.get("/console", headers={"X-Console-Fragment": "1"}))
        answers.append(await console.http.get(f"/console/jobs/{NOT_A_JOB}"))
        answers.append(await console.http.post(f"/console/jobs/{job['id']}/resolve", data={"outcome": "failed"}))
        answers.append(await console.http.get("/console/static/console.css"))
        answers.append(await console.http.get("/console/static/console.js"))
    for answer in answers:
        where = f"{answer.request.method} {answer.request.url.path}"
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, where
        assert "unsafe" not in csp, where
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["x-content-type-options"] == "nosniff"
        if answer.headers.get("content-type", "").startswith("text/html"):
            assert answer.headers["cache-control"] == "no-store", where
            assert not INLINE_SCRIPT.search(answer.text), where
            assert not INLINE_STYLE.search(answer.text), where
            assert not INLINE_HANDLER.search(answer.text), where
    assert (await job_row(db, job["id"]))["status"] == "uncertain"  # that CSRF-less POST changed nothing


async def test_static_files_are_served_versioned_and_nothing_else_is(web):
    server = await web()
    async with Console(server.url) as console:
        page = (await console.http.get("/console/sign-in")).text
        css = re.search(r'href="(/console/static/console\.css\?v=[0-9a-f]+)"', page).group(1)
        versioned = await console.http.get(css)
        assert versioned.status_code == 200 and versioned.headers["content-type"].startswith("text/css")
        assert "immutable" in versioned.headers["cache-control"]
        assert "no-cache" in (await console.http.get("/console/static/console.css?v=old")).headers["cache-control"]
        for path in ("/console/static/missing.css", "/console/static/..%2Fpages.py", "/console/static/pages.py",
                     "/console/static/%2e%2e%2f__init__.py"):
            assert (await console.http.get(path)).status_code == 404, path


# --- CSRF: refused, and nothing changed ----------------------------------------------


@pytest.mark.parametrize("csrf", ["missing", "empty", "wrong", "another-session's", "the-sign-in-form's"])
async def test_an_action_without_this_sessions_csrf_token_is_refused_and_changes_nothing(uncertain, db, csrf):
    server, owner, job = uncertain
    async with Console(server.url) as console, Console(server.url) as other:
        await console.sign_in()
        await other.sign_in()
        given = {
            "missing": None,
            "empty": "",
            "wrong": csrf_of(await console.page("/console"))[:-2] + "AA",
            "another-session's": csrf_of(await other.page("/console")),
            "the-sign-in-form's": csrf_of((await httpx.AsyncClient(base_url=server.url).get("/console/sign-in")).text),
        }[csrf]
        resolve = hidden_fields(await console.page(f"/console/jobs/{job['id']}/resolve?outcome=failed"),
                                f"/console/jobs/{job['id']}/resolve")
        grant = hidden_fields(await console.page(f"/console/owners/{owner.owner_id}/grant?credits=50"),
                              f"/console/owners/{owner.owner_id}/grant")
        before = await money(db, owner.owner_id)
        for action, fields in ((f"/console/jobs/{job['id']}/resolve", resolve),
                               (f"/console/owners/{owner.owner_id}/grant", grant),
                               ("/console/sign-out", {})):
            fields = {k: v for k, v in fields.items() if k != "csrf"}
            if given is not None:
                fields["csrf"] = given
            answer = await console.http.post(action, data=fields)
            assert answer.status_code == 403, action
            assert "Refused — nothing was changed" in answer.text
        assert (await job_row(db, job["id"]))["status"] == "uncertain"
        assert await money(db, owner.owner_id) == before
        assert "<h1>Fleet</h1>" in await console.page("/console")  # still signed in


# --- resolve ------------------------------------------------------------------------------


async def test_resolve_with_a_task_id_after_its_confirmation(uncertain, db):
    server, owner, job = uncertain
    async with Console(server.url) as console:
        await console.sign_in()
        listed = await console.page("/console/needs-a-human")
        assert f'data-job="{job["id"]}"' in listed
        deadline = await db.fetchval("select deadline_at from jobs where id = $1", job["id"])
        assert f"expires, refunded, at {deadline:%Y-%m-%d %H:%M:%S} UTC" in listed
        confirm_path = f"/console/jobs/{job['id']}/resolve?outcome=task&task_id=task-from-the-dashboard"
        confirm = await console.page(confirm_path)
        assert "task-from-the-dashboard" in confirm
        assert (await job_row(db, job["id"]))["status"] == "uncertain"  # a confirmation page changes nothing
        answer = await console.submit(confirm_path, f"/console/jobs/{job['id']}/resolve")
        assert answer.status_code == 303 and answer.headers["location"] == f"/console/jobs/{job['id']}?done=resolved"
        row = await job_row(db, job["id"])
        assert (row["status"], row["provider_task_id"]) == ("running", "task-from-the-dashboard")
        assert "Resolved with the task id" in await console.page(answer.headers["location"])
        saved = await db.fetchval("select detail from job_events where job_id = $1 and type = 'task_saved'",
                                  job["id"])
        assert saved == {"task_id": "task-from-the-dashboard", "job_was_closed": False, "by": "operator"}
        # A stale tab's confirmation sent again: refused. Loaded again, the
        # page confirms nothing: the job is no longer uncertain.
        stale = hidden_fields(confirm, f"/console/jobs/{job['id']}/resolve")
        again = await console.http.post(f"/console/jobs/{job['id']}/resolve", data=stale)
        assert again.status_code == 409 and "this one is running" in again.text
        reloaded = await console.http.get(confirm_path)
        assert reloaded.status_code == 409 and "Only an uncertain job can be resolved; this one is running" \
            in reloaded.text and f'action="/console/jobs/{job["id"]}/resolve"' not in reloaded.text
    assert (await job_row(db, job["id"]))["provider_task_id"] == "task-from-the-dashboard"


async def test_resolve_as_failed_refunds_once(uncertain, db):
    server, owner, job = uncertain
    async with Console(server.url) as console:
        await console.sign_in()
        confirm_path = f"/console/jobs/{job['id']}/resolve?outcome=failed"
        assert "credits refunded" in await console.page(confirm_path)
        fields = hidden_fields(await console.page(confirm_path), f"/console/jobs/{job['id']}/resolve")
        # A double click: the same form twice at once. One closes the job; the other finds it closed.
        answers = await asyncio.gather(*(console.http.post(f"/console/jobs/{job['id']}/resolve", data=fields)
                                         for _ in range(2)))
        assert sorted(a.status_code for a in answers) == [303, 409]
    row = await job_row(db, job["id"])
    assert (row["status"], row["error_code"], row["credits_refunded"]) == ("failed", "resolved_failed", 25)
    assert await money(db, owner.owner_id) == (1000, 1000, 0, 0, 1)
    assert await db.fetchval("select count(*) from ledger where job_id = $1 and kind = 'refund'", job["id"]) == 1


@pytest.mark.parametrize("query", ["outcome=nonsense", "outcome=task", "task_id=" + "x" * 501,
                                   "outcome=failed&task_id=abc"])
async def test_a_resolve_confirmation_for_bad_input_is_a_clear_400(uncertain, db, query):
    server, owner, job = uncertain
    async with Console(server.url) as console:
        await console.sign_in()
        answer = await console.http.get(f"/console/jobs/{job['id']}/resolve?{query}")
    assert answer.status_code == 400 and "Cannot resolve" in answer.text
    assert (await job_row(db, job["id"]))["status"] == "uncertain"


# --- grant --------------------------------------------------------------------------------


async def test_a_grant_moves_once_per_confirmation(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=100)
    async with Console(server.url) as console:
        await console.sign_in()
        confirm_path = f"/console/owners/{owner.owner_id}/grant?credits=40&reason=ticket+1234"
        confirm = await console.page(confirm_path)
        assert "the balance goes from\n    100 to 140" in confirm
        assert await money(db, owner.owner_id) == (100, 100, 0, 0, 1)
        fields = hidden_fields(confirm, f"/console/owners/{owner.owner_id}/grant")
        # The same confirmation submitted 12 times at once: the money moves once.
        answers = await asyncio.gather(*(console.http.post(f"/console/owners/{owner.owner_id}/grant", data=fields)
                                         for _ in range(12)))
        locations = sorted(a.headers["location"].split("done=")[1] for a in answers)
        assert locations == ["grant_replayed"] * 11 + ["granted"]
        assert await money(db, owner.owner_id) == (140, 140, 0, 0, 2)
        assert "ticket 1234" in await console.page(f"/console/owners/{owner.owner_id}")
        # The same form with another amount under its key: refused, nothing moves.
        changed = await console.http.post(f"/console/owners/{owner.owner_id}/grant", data={**fields, "credits": "41"})
        assert changed.status_code == 409
        # A new confirmation is a new grant.
        assert (await console.submit(confirm_path, f"/console/owners/{owner.owner_id}/grant")).status_code == 303
        assert await money(db, owner.owner_id) == (180, 180, 0, 0, 3)
        # The owner page's form makes the key: its confirmation loaded twice
        # (Back) and confirmed each time is one grant.
        key = hidden_fields(await console.page(f"/console/owners/{owner.owner_id}"),
                            f"/console/owners/{owner.owner_id}/grant")["grant_key"]
        keyed_path = f"/console/owners/{owner.owner_id}/grant?grant_key={key}&credits=7&reason=back"
        for done in ("granted", "grant_replayed"):
            answer = await console.submit(keyed_path, f"/console/owners/{owner.owner_id}/grant")
            assert answer.headers["location"].endswith(f"done={done}")
        assert await money(db, owner.owner_id) == (187, 187, 0, 0, 4)
        bad = await console.http.get(f"/console/owners/{owner.owner_id}/grant?grant_key=nope&credits=7")
        assert bad.status_code == 400


@pytest.mark.parametrize("credits", ["0", "-10", "abc", "1.5", str(10**12 + 1), ""])
async def test_a_grant_of_a_bad_amount_is_a_clear_400_and_moves_nothing(web, make_owner, db, credits):
    server = await web()
    owner = await make_owner(credits=100)
    async with Console(server.url) as console:
        await console.sign_in()
        confirm = await console.http.get(f"/console/owners/{owner.owner_id}/grant?credits={credits}")
        assert confirm.status_code == 400 and "credits: a whole number" in confirm.text
        fields = hidden_fields(await console.page(f"/console/owners/{owner.owner_id}/grant?credits=5"),
                               f"/console/owners/{owner.owner_id}/grant")
        answer = await console.http.post(f"/console/owners/{owner.owner_id}/grant", data={**fields, "credits": credits})
        assert answer.status_code == 400
    assert await money(db, owner.owner_id) == (100, 100, 0, 0, 1)


async def test_a_grant_to_no_such_owner_is_a_404(web):
    server = await web()
    nobody = "own_" + "0" * 24
    async with Console(server.url) as console:
        await console.sign_in()
        assert (await console.http.get(f"/console/owners/{nobody}/grant?credits=5")).status_code == 404
        csrf = csrf_of(await console.page("/console"))
        answer = await console.http.post(f"/console/owners/{nobody}/grant",
                                         data={"csrf": csrf, "credits": "5", "grant_key": "console-" + "1" * 32})
        assert answer.status_code == 404 and "no such owner" in answer.text


# --- redeliver ----------------------------------------------------------------------------


async def test_redeliver_queues_a_failed_delivery_again(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        endpoint = (await c.post("/v1/webhook-endpoints", json={"url": "https://93.184.216.34/hook"})).json()
    job = await new_job(server, owner.api_key)
    await make_uncertain(db, job["id"])
    async with Console(server.url) as console:
        await console.sign_in()
        await console.submit(f"/console/jobs/{job['id']}/resolve?outcome=failed", f"/console/jobs/{job['id']}/resolve")
        notification = await db.fetchval("select id from notifications where job_id = $1", job["id"])
        # As if its 24 h of retries had run out.
        await db.execute("update deliveries set status = 'failed', attempts = 9, last_status_code = 503 "
                         "where notification_id = $1", notification)
        await db.execute("delete from outbox where kind = 'notify'")
        page = await console.page(f"/console/jobs/{job['id']}")
        assert endpoint["id"] in page and "93.184.216.34" in page
        action = f"/console/notifications/{notification}/redeliver"
        answer = await console.submit(f"/console/jobs/{job['id']}", action)
        assert answer.headers["location"] == f"/console/jobs/{job['id']}?done=redelivered"
        delivery = await db.fetchrow("select status, attempts from deliveries where notification_id = $1", notification)
        assert tuple(delivery) == ("pending", 0)
        assert await db.fetchval("select count(*) from outbox where kind = 'notify' and job_id = $1", job["id"]) == 1
        # Still pending: nothing to queue, and it says so.
        again = await console.submit(f"/console/jobs/{job['id']}", action)
        assert again.headers["location"] == f"/console/jobs/{job['id']}?done=redelivered_none"
        csrf = csrf_of(await console.page("/console"))
        missing = await console.http.post(f"/console/notifications/evt_{'0' * 32}/redeliver", data={"csrf": csrf})
        assert missing.status_code == 404 and "no such notification" in missing.text


# --- search and pages --------------------------------------------------------------------


async def test_search_finds_a_job_an_owner_a_notification_or_a_task(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    first, second = await new_job(server, owner.api_key), await new_job(server, owner.api_key)
    await db.execute("update jobs set provider_task_id = 'shared-task' where id = any($1::text[])",
                     [first["id"], second["id"]])
    async with Console(server.url) as console:
        await console.sign_in()
        by_job = await console.http.get(f"/console/search?q=+{first['id']}+")
        assert by_job.headers["location"] == f"/console/jobs/{first['id']}"
        by_owner = await console.http.get(f"/console/search?q={owner.owner_id}")
        assert by_owner.headers["location"] == f"/console/owners/{owner.owner_id}"
        by_task = await console.page("/console/search?q=shared-task")
        assert first["id"] in by_task and second["id"] in by_task
        assert "No job has the provider task id" in await console.page("/console/search?q=unknown-task")
        assert "There is no job" in await console.page(f"/console/search?q={NOT_A_JOB}")
        assert (await console.http.get("/console/search?q=" + "x" * 501)).status_code == 400
        assert (await console.http.get("/console/search?q=%00")).status_code == 400  # not PostgreSQL's 500
        assert (await console.http.get(f"/console/jobs/{NOT_A_JOB}")).status_code == 404
        assert (await console.http.get("/console/jobs/not-an-id")).status_code == 404
        assert (await console.http.get("/console/owners/own_nope")).status_code == 404


async def test_the_fleet_fragment_is_the_live_part_only(web, make_owner, db):
    server = await web()
    owner = await make_owner()
    job = await new_job(server, owner.api_key)
    async with Console(server.url) as console:
        await console.sign_in()
        whole = await console.page("/console")
        live = (await console.http.get("/console", headers={"X-Console-Fragment": "1"})).text
    assert "<html" in whole and 'data-live-seconds="3"' in whole
    assert "<html" not in live and f'data-job="{job["id"]}"' in live
    assert re.search(r'data-status="queued"><span class="n">1</span>', live)


# --- secrets ------------------------------------------------------------------------------


async def test_no_page_shows_a_secret(web, make_owner, db):
    server = await web(**PROVIDER_SECRETS)
    owner = await make_owner()
    async with server.client(owner.api_key) as c:
        endpoint = (await c.post("/v1/webhook-endpoints",
                                 json={"url": "https://93.184.216.34/hook?key=receivers-own-secret",
                                       "events": ["job.uncertain", "job.failed"]})).json()
    job = await new_job(server, owner.api_key)
    await make_uncertain(db, job["id"])
    secrets = [owner.api_key, endpoint["secret"], endpoint["secret"].removeprefix("whsec_"), ADMIN_TOKEN,
               "receivers-own-secret", *PROVIDER_SECRETS.values(), read_token(job["id"], SECRET_KEY),
               job["status_url"].split("token=")[1]]
    async with Console(server.url) as console:
        seen = [(await console.http.get("/console/sign-in")).text]
        seen.append((await console.sign_in(token=ADMIN_TOKEN + "-typo")).text)
        await console.sign_in()
        for path in page_paths(job["id"], owner.owner_id)[:-1]:
            seen.append((await console.http.get(path)).text)
        seen.append((await console.http.get("/console", headers={"X-Console-Fragment": "1"})).text)
    for text in seen:
        for secret in secrets:
            assert secret not in text
        assert "token=" not in text


async def test_an_owners_jobs_page_by_page_and_by_status(web, make_owner, db):
    server = await web()
    owner = await make_owner(credits=10_000, max_active=40)
    made = [(await new_job(server, owner.api_key))["id"] for _ in range(30)]
    await make_uncertain(db, made[3])
    async with Console(server.url) as console:
        await console.sign_in()
        first = await console.page(f"/console/owners/{owner.owner_id}")
        shown = re.findall(r'<a href="/console/jobs/(job_[0-9a-f]{24})">', first)
        assert shown == made[::-1][:25]  # newest first
        older = html.unescape(re.search(r'<a href="([^"]+)">Older jobs</a>', first).group(1))
        second = await console.page(older)
        assert re.findall(r'<a href="/console/jobs/(job_[0-9a-f]{24})">', second) == made[::-1][25:]
        assert "Older jobs" not in second
        only = await console.page(f"/console/owners/{owner.owner_id}?status=uncertain")
        assert re.findall(r'<a href="/console/jobs/(job_[0-9a-f]{24})">', only) == [made[3]]
        # An unknown status or a forged cursor is no filter and the first page, not an error.
        # (Each load makes its grant form a new one-time key.)
        def same(page: str) -> str:
            return re.sub(r"console-[0-9a-f]{32}", "console-key", page)
        assert same(await console.page(f"/console/owners/{owner.owner_id}?status=nope&cursor=forged")) == same(first)
