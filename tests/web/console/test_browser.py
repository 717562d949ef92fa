"""The operator's console in a real headless Chromium, against a real
longcall (web app, PostgreSQL, settler, provider simulator): signing in
and out, the fleet page refreshing itself, resolving uncertain jobs through
their confirmations, forms without their CSRF token refused, the CSP
holding, and a phone's width.

Every page shown is saved as a full-page screenshot in the test's tmp_path
(and $CONSOLE_SCREENSHOTS/<test>/ when set). Without chromium every test
here is skipped with one reason; REQUIRE_CHROMIUM=1 makes that a failure."""
from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.async_api import expect

from tests.roads.conftest import assert_money_balances, wait_for_status, wait_until
from tests.support.console import make_uncertain
from tests.support.simulator import clear_faults, set_faults
from tests.web.console.conftest import CHROMIUM, REQUIRED, SKIP_REASON, TIMEOUT_MS, Tab, provider_env

# One skip for the module, so `pytest -rs` names it in one line (a skipif
# mark is reported at each test's own line). With REQUIRE_CHROMIUM set, the
# `browser` fixture fails every test instead.
if CHROMIUM is None and not REQUIRED:
    pytest.skip(SKIP_REASON, allow_module_level=True)

SIM_JOB = {"provider": "sim", "model": "image-fast", "max_credits": 10}
# Two Replicate jobs alike: the settler's in-doubt look-up finds two
# predictions that could be either's and adopts none (tests/roads/test_recovery.py).
TWIN_REPLICATE_JOB = {"provider": "replicate", "model": "acme/painter", "input": {"duration_s": 0.2},
                      "max_credits": 10}
REPLICATE_AUTH = {"Authorization": "Bearer r8_roads_test_token"}  # provider_env's token
PHONE = {"width": 390, "height": 844}


async def create_job(server, owner, body: dict) -> str:
    async with server.client(owner.api_key) as c:
        answer = await c.post("/v1/jobs", json=body)
    assert answer.status_code in (200, 201, 202), answer.text
    return answer.json()["id"]


async def job_row(db, job_id: str) -> dict:
    return dict(await db.fetchrow("select * from jobs where id = $1", job_id))


async def submit(tab: Tab, button: str) -> int:
    """Click a form's button, wait for the page it ends on; the status of
    the answer to the form itself (a 303 for an action that was done)."""
    async with tab.page.expect_navigation() as navigation:
        await tab.page.get_by_role("button", name=button, exact=True).click()
    final = await navigation.value
    assert final is not None
    request = final.request
    while request.redirected_from is not None:
        request = request.redirected_from
    first = await request.response()
    assert first is not None
    return first.status


def at(path: str, query: str | None = None):
    """A wait_for_url predicate: this path (and query)."""
    def matches(url: str) -> bool:
        parts = urlsplit(url)
        return parts.path == path and (query is None or parts.query == query)
    return matches


async def test_sign_in(web, open_tab):
    server = await web()
    tab = await open_tab(server.url)
    await tab.goto("/console", "sign-in")
    where = urlsplit(tab.page.url)
    assert (where.path, where.query) == ("/console", "")  # the entry's page is the sign-in form itself
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text("Sign in")

    await tab.page.get_by_label("Admin token").fill("not-the-admin-token")
    status = await submit(tab, "Sign in")
    await tab.shot("sign-in-refused")
    assert status == 401
    await expect(tab.page.get_by_role("alert")).to_have_text("That is not the admin token.")
    assert await tab.session_cookie() is None

    await tab.page.get_by_label("Admin token").fill("test-admin-token")
    assert await submit(tab, "Sign in") == 303
    assert tab.page.url == tab.url("/console")
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text("Fleet")
    await tab.shot("fleet")
    cookie = await tab.session_cookie()
    assert cookie is not None
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"], cookie["secure"]) == (True, "Strict", "/console",
                                                                                          False)
    assert 7 * 3600 < cookie["expires"] - time.time() <= 8 * 3600  # SESSION_TTL_S, an operator's day
    # no script may read it
    assert "longcall_console" not in await tab.page.evaluate("document.cookie")


async def test_fleet_page_follows_a_job_to_succeeded(web, make_settings, make_owner, sim, settlers, db, open_tab):
    env = provider_env(sim.url)
    server = await web(**env)
    await settlers(make_settings(**env))
    owner = await make_owner(credits=100)
    tab = await open_tab(server.url)
    await tab.sign_in()
    # Marks this document: still there at the end, so the page was never reloaded.
    await tab.page.evaluate("window.__same_document = true")
    succeeded = tab.page.locator('#finished-counts [data-status="succeeded"] .n')  # finished in the last hour
    await expect(succeeded).to_have_text("0")

    # Long enough to be seen running between two refreshes 3 s apart.
    job_id = await create_job(server, owner, {**SIM_JOB, "input": {"duration_s": 5}})
    row = tab.page.locator(f'#in-flight tr[data-job="{job_id}"]')
    await expect(row.locator(".badge")).to_have_text("running", timeout=TIMEOUT_MS)
    await expect(tab.page.locator('#in-flight-counts [data-status="running"] .n')).to_have_text("1")
    path = await tab.shot("fleet-running")
    print(f"fleet screenshot: {path}")
    await expect(succeeded).to_have_text("1", timeout=TIMEOUT_MS)
    # The same refresh moved it from "In flight" to "Finished last".
    await expect(row).to_have_count(0)
    await expect(tab.page.locator("#in-flight")).to_contain_text("No job is in flight.")
    await expect(tab.page.locator(f'#recently-finished tr[data-job="{job_id}"] .badge')).to_have_text("succeeded")
    await tab.shot("fleet-succeeded")
    assert await tab.page.evaluate("window.__same_document") is True
    assert (await job_row(db, job_id))["status"] == "succeeded"


async def test_uncertain_jobs_resolved_in_the_console(web, make_settings, make_owner, sim, settlers, db, open_tab):
    # Every create is made and then its answer lost; the twins cannot be told apart: both uncertain.
    set_faults(sim.url, submit_timeout_after_create=1)
    env = provider_env(sim.url)
    server = await web(**env)
    await settlers(make_settings(**env), provider_timeout_s=1.0)
    owner = await make_owner(credits=100)
    with_task = await create_job(server, owner, TWIN_REPLICATE_JOB)
    as_failed = await create_job(server, owner, TWIN_REPLICATE_JOB)
    for job_id in (with_task, as_failed):
        await wait_for_status(db, job_id, "uncertain", timeout=20)

    async def no_open_intents() -> bool:  # nothing left that could submit again: only their give-up timers
        rows = await db.fetch("select kind, claimed_until is null and not_before > now() + interval '1 hour' as idle"
                              " from outbox where kind in ('submit', 'settle')")
        return len(rows) == 2 and all(r["kind"] == "settle" and r["idle"] for r in rows)

    await wait_until(no_open_intents, timeout=15)
    clear_faults(sim.url)
    listed = httpx.get(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE_AUTH, trust_env=False).json()
    predictions = [p["id"] for p in listed["results"]]
    assert len(predictions) == 2
    task_id = predictions[0]  # twins: either is a real task to resolve with

    tab = await open_tab(server.url)
    await tab.sign_in()
    await expect(tab.page.locator('#in-flight-counts [data-status="uncertain"] .n')).to_have_text("2")
    await tab.page.get_by_role("link", name="Needs a human").first.click()
    await tab.page.wait_for_url(tab.url("/console/needs-a-human"))
    await tab.shot("needs-a-human")
    article = tab.page.locator(f'article[data-job="{with_task}"]')
    await article.locator('input[name="task_id"]').fill(task_id)
    await article.get_by_role("button", name="Resolve with task id…").click()
    await tab.page.wait_for_url(at(f"/console/jobs/{with_task}/resolve"))
    await tab.shot("confirm-resolve")
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text(f"Resolve {with_task}?")
    await expect(tab.page.locator("main code")).to_have_text(task_id)
    assert (await job_row(db, with_task))["status"] == "uncertain"  # a confirmation page changes nothing
    assert await submit(tab, "Resolve with this task") == 303
    assert tab.page.url == tab.url(f"/console/jobs/{with_task}?done=resolved")
    await expect(tab.page.get_by_role("status")).to_contain_text("Resolved with the task id")
    await tab.shot("job-resolved")
    deadline = time.monotonic() + 30
    while await tab.page.locator("#job-status").inner_text() != "succeeded":
        assert time.monotonic() < deadline, "the resolved job did not succeed in 30 s"
        await asyncio.sleep(1)
        await tab.page.reload()
    await expect(tab.page.locator("#task-id")).to_have_text(task_id)
    await tab.shot("job")
    row = await job_row(db, with_task)
    assert (row["status"], row["provider_task_id"]) == ("succeeded", task_id)

    # The other, as failed, from its own page.
    await tab.goto(f"/console/jobs/{as_failed}", "job-uncertain")
    await tab.page.get_by_role("button", name="Resolve as failed…").click()
    await tab.page.wait_for_url(at(f"/console/jobs/{as_failed}/resolve", "outcome=failed"))
    await tab.shot("confirm-resolve-failed")
    await expect(tab.page.locator("main .flash")).to_contain_text("credits refunded")
    await submit(tab, "Resolve as failed")
    assert tab.page.url == tab.url(f"/console/jobs/{as_failed}?done=resolved_failed")
    await expect(tab.page.get_by_role("status")).to_contain_text("Resolved as failed")
    await expect(tab.page.locator("#job-status")).to_have_text("failed")
    await tab.shot("job-failed")
    row = await job_row(db, as_failed)
    assert (row["status"], row["error_code"]) == ("failed", "resolved_failed")
    assert row["credits_refunded"] == row["credits_reserved"] == 10 and row["credits_charged"] == 0
    await assert_money_balances(db)

    # The task id finds its job again, from the search box of every page.
    await tab.page.get_by_role("searchbox", name="Search by id").first.fill(task_id)
    await tab.page.get_by_role("button", name="Search").first.click()
    await tab.page.wait_for_url(at("/console/search", f"q={task_id}"))
    await tab.shot("search")
    await expect(tab.page.locator(f'main a[href="/console/jobs/{with_task}"]')).to_have_count(1)
    await expect(tab.page.locator(f'main a[href="/console/jobs/{as_failed}"]')).to_have_count(0)


async def test_forms_without_their_csrf_token_are_refused(web, make_owner, db, open_tab):
    server = await web()
    owner = await make_owner(credits=100)
    job_id = await create_job(server, owner, {**SIM_JOB, "input": {}})
    await make_uncertain(db, job_id)
    before = await job_row(db, job_id)
    tab = await open_tab(server.url)
    await tab.sign_in()

    # Resolve as failed, its confirmation's CSRF token removed.
    await tab.goto(f"/console/jobs/{job_id}/resolve?outcome=failed", "confirm-resolve")
    await tab.page.evaluate("document.querySelector('main form input[name=csrf]').remove()")
    assert await submit(tab, "Resolve as failed") == 403
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text("Refused — nothing was changed")
    await tab.shot("refused")
    assert await job_row(db, job_id) == before
    # The same form as the page gives it: done (so the refusal was the token's).
    await tab.goto(f"/console/jobs/{job_id}/resolve?outcome=failed", "confirm-resolve-again")
    assert await submit(tab, "Resolve as failed") == 303
    await expect(tab.page.locator("#job-status")).to_have_text("failed")
    await tab.shot("job")
    assert (await job_row(db, job_id))["status"] == "failed"

    # A grant, its token swapped for a good one of another session.
    other = await open_tab(server.url)
    await other.sign_in()
    foreign = await other.page.locator("form.sign-out input[name=csrf]").input_value()
    await tab.page.get_by_role("link", name="Owners").click()
    await tab.page.wait_for_url(tab.url("/console/owners"))
    await tab.shot("owners")
    await tab.page.locator(f'tr[data-owner="{owner.owner_id}"] a').first.click()
    await tab.page.wait_for_url(tab.url(f"/console/owners/{owner.owner_id}"))
    await tab.shot("owner")
    balance = await db.fetchval("select balance from owners where id = $1", owner.owner_id)
    await expect(tab.page.locator("#balance")).to_have_text(str(balance))
    await tab.page.get_by_label("Grant credits").fill("25")
    await tab.page.get_by_label("Reason").fill("ticket 17")
    await tab.page.get_by_role("button", name="Grant…").click()
    await tab.page.wait_for_url(at(f"/console/owners/{owner.owner_id}/grant"))
    confirm_url = tab.page.url  # its grant_key, made with the owner page's form, rides in it
    assert urlsplit(confirm_url).query.endswith("&credits=25&reason=ticket+17")
    await tab.shot("confirm-grant")
    mine = await tab.page.locator("main form input[name=csrf]").input_value()
    assert foreign != mine
    await tab.page.locator("main form input[name=csrf]").evaluate("(input, value) => input.value = value", foreign)
    assert await submit(tab, "Grant 25 credits") == 403
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text("Refused — nothing was changed")
    await tab.shot("refused-grant")
    assert await db.fetchval("select balance from owners where id = $1", owner.owner_id) == balance
    assert await db.fetchval("select count(*) from ledger where owner_id = $1 and kind = 'grant'",
                             owner.owner_id) == 1  # the owner's first credits only
    # Back to the confirmation and submitted as it is: granted, once.
    await tab.page.goto(confirm_url)
    assert await submit(tab, "Grant 25 credits") == 303
    assert tab.page.url == tab.url(f"/console/owners/{owner.owner_id}?done=granted")
    await expect(tab.page.locator("#balance")).to_have_text(str(balance + 25))
    await tab.shot("owner-granted")
    assert await db.fetchval("select balance from owners where id = $1", owner.owner_id) == balance + 25
    # Back again (the page loaded anew) and confirmed again: the same grant, nothing moves twice.
    await tab.page.go_back()
    await tab.page.wait_for_url(confirm_url)
    assert await submit(tab, "Grant 25 credits") == 303
    assert tab.page.url == tab.url(f"/console/owners/{owner.owner_id}?done=grant_replayed")
    assert await db.fetchval("select balance from owners where id = $1", owner.owner_id) == balance + 25


async def test_sign_out(web, open_tab):
    server = await web()
    tab = await open_tab(server.url)
    await tab.sign_in()
    # A second tab on the fleet, refreshing itself: signed out elsewhere, it
    # gets a 401 and reloads onto the sign-in form (console.js).
    watching = await tab.context.new_page()
    await watching.goto(tab.url("/console"))
    await expect(watching.get_by_role("heading", level=1)).to_have_text("Fleet")

    await submit(tab, "Sign out")
    assert tab.page.url == tab.url("/console/sign-in")
    await expect(tab.page.get_by_role("heading", level=1)).to_have_text("Sign in")
    await tab.shot("signed-out")
    assert await tab.session_cookie() is None
    await expect(tab.page.get_by_role("button", name="Sign out")).to_have_count(0)

    await expect(watching.get_by_role("heading", level=1)).to_have_text("Sign in", timeout=TIMEOUT_MS)
    await tab.shot("other-tab-signed-out", watching)
    await tab.goto("/console", "sign-in")
    assert tab.page.url == tab.url("/console")
    await expect(tab.page.get_by_label("Admin token")).to_be_visible()


async def test_the_csp_holds(web, open_tab):
    """Every test's tab fails on a CSP violation or a script error (the
    open_tab fixture); here, that a violation is seen at all, and that the
    console's own stylesheet and script are allowed."""
    server = await web()
    tab = await open_tab(server.url)
    await tab.sign_in()
    header = await tab.page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
    assert header == "rgb(29, 35, 43)"  # console.css's --ink: the stylesheet applied
    script_ok = await tab.page.evaluate("""async () => {
        const answer = await fetch('/console', {headers: {'X-Console-Fragment': '1'}});
        const text = await answer.text();
        return [answer.status, text.includes('id="in-flight"') && !text.includes('<html')];
    }""")
    assert script_ok == [200, True]  # connect-src 'self': the refresh console.js makes (the live part only)
    assert tab.take_trouble() == []

    ran = await tab.page.evaluate("""() => {
        const s = document.createElement('script');
        s.textContent = 'window.__inline_ran = true';
        document.body.append(s);
        return window.__inline_ran === true;
    }""")
    assert ran is False
    async def reported() -> bool:  # the console message comes after the evaluate's answer
        return bool(tab.trouble)

    await wait_until(reported, timeout=10)
    seen = tab.take_trouble()
    # Chromium's wording changes ("Refused to execute inline script ..." before
    # 15x, "Executing inline script violates ..." since): the directive is named in both.
    assert any("inline script" in line and "Content Security Policy directive" in line for line in seen), seen


async def test_a_phone(web, make_owner, db, open_tab):
    server = await web()
    owner = await make_owner(credits=100)
    job_id = await create_job(server, owner, {**SIM_JOB, "input": {"prompt": "a lighthouse at dusk"}})
    await make_uncertain(db, job_id)  # its page shows the resolve forms too
    tab = await open_tab(server.url, viewport=PHONE)
    await tab.sign_in()
    for path, name in (("/console", "fleet-phone"), (f"/console/jobs/{job_id}", "job-phone"),
                       ("/console/needs-a-human", "needs-a-human-phone"),
                       (f"/console/owners/{owner.owner_id}", "owner-phone")):
        await tab.goto(path, name)
        widths = await tab.page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[1] == PHONE["width"]
        assert widths[0] <= widths[1], f"{path} scrolls sideways on a phone: {widths[0]} px wide"


async def test_the_owner_page_counts_api_keys(web, make_owner, open_tab):
    server = await web()
    owner = await make_owner(credits=10)
    tab = await open_tab(server.url)
    await tab.sign_in()
    await tab.goto(f"/console/owners/{owner.owner_id}", "owner")
    about = await tab.page.locator("#about dl").inner_text()
    assert "API keys\n1 active" in about, about
