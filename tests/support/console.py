"""Driving the operator's console over HTTP (app/web/console/), as a
browser without scripts would: GET a page, read its form's CSRF token,
POST the form. The admin token is tests/conftest.py's ADMIN_TOKEN."""
from __future__ import annotations

import html
import re

import httpx

from app.domain import jobs

ADMIN_TOKEN = "test-admin-token"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_HIDDEN = re.compile(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">')


def csrf_of(page: str) -> str:
    found = _CSRF.search(page)
    assert found, "the page has no form with a CSRF token"
    return html.unescape(found.group(1))


def hidden_fields(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the form posting to `action` on this page."""
    start = page.index(f'action="{action}"')
    form = page[start:page.index("</form>", start)]
    return {name: html.unescape(value) for name, value in _HIDDEN.findall(form)}


class Console:
    """One browser's session: its own cookie jar."""

    def __init__(self, base_url: str):
        self.http = httpx.AsyncClient(base_url=base_url, timeout=30, follow_redirects=False)

    async def __aenter__(self) -> Console:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()

    async def sign_in(self, token: str = ADMIN_TOKEN, next: str = "/console") -> httpx.Response:
        form = await self.http.get("/console/sign-in")
        assert form.status_code == 200, form.text
        return await self.http.post("/console/sign-in", data={"csrf": csrf_of(form.text), "next": next,
                                                              "token": token})

    async def page(self, path: str) -> str:
        answer = await self.http.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
        return answer.text

    async def submit(self, page_path: str, action: str, **extra: str) -> httpx.Response:
        """Post the form at `action` found on `page_path`, as the page has it, plus `extra`."""
        fields = hidden_fields(await self.page(page_path), action)
        return await self.http.post(action, data={**fields, **extra})


async def make_uncertain(pool, job_id: str, reason: str = "the submit's answer was lost") -> None:
    """The settler's own two steps for a lost submit answer that cannot be
    looked up: claim the submit, then mark the job uncertain."""
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, job_id) is not None
        assert await jobs.mark_uncertain(conn, job_id, reason)
