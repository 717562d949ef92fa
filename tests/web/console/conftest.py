"""Fixtures for the console's tests in a real browser (test_browser.py):
where chromium is, one headless Chromium per module, and a tab per test
that records what the browser reports (console messages, script errors)
and saves a screenshot of every page it shows.

Playwright's async API runs on the session event loop, the one the web
server of tests/conftest.py serves on: the sync API would block that loop.
Playwright never downloads a browser here; it drives the chromium found."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.async_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Error,
    Page,
    Response,
    async_playwright,
    expect,
)

from tests.roads.conftest import provider_env, settlers, sim, sim_server  # noqa: F401  (fixtures re-exported)
from tests.support.console import ADMIN_TOKEN

SKIP_REASON = "the console's browser tests need chromium, which was not found"
# What works as root on a closed network: no sandbox (root), nothing the
# browser would fetch for itself.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-quic"]
TIMEOUT_MS = 30_000  # for any one step; a loaded CI machine is slow
SESSION_COOKIE = "longcall_console"  # app/web/console/session.py
# expect() has its own default (5 s), not the context's.
expect.set_options(timeout=TIMEOUT_MS)


def find_chromium() -> str | None:
    """$CHROMIUM if set (and nothing else then), else chromium on PATH, else Debian's."""
    given = os.environ.get("CHROMIUM")
    if given:
        return given if os.path.isfile(given) and os.access(given, os.X_OK) else None
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


CHROMIUM = find_chromium()
# CI sets it: there a missing chromium is a failure, not a skip.
REQUIRED = os.environ.get("REQUIRE_CHROMIUM", "") not in ("", "0")


@pytest.fixture(scope="module")
async def browser():
    """One headless Chromium for the module (a new context per test)."""
    if CHROMIUM is None:
        pytest.fail(f"REQUIRE_CHROMIUM is set and {SKIP_REASON} (set CHROMIUM to its path)", pytrace=False)
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield launched
        await launched.close()


def is_trouble(message: ConsoleMessage) -> bool:
    """A CSP violation (Chromium names the "Content Security Policy directive";
    older ones began "Refused to ...", newer "Executing inline script
    violates ...") or a script's own error. A page answered 4xx on purpose is
    logged as "Failed to load resource": not trouble."""
    text = message.text
    if "Content Security Policy" in text or text.startswith("Refused to"):
        return True
    return message.type == "error" and not text.startswith("Failed to load resource")


@dataclass
class Tab:
    """A browser context (its own cookies) and its first page, on one server."""
    base_url: str
    context: BrowserContext
    page: Page
    shots: Path
    copy_to: Path | None
    trouble: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return self.base_url + path

    async def goto(self, path: str, shot: str) -> Response:
        answer = await self.page.goto(self.url(path))
        assert answer is not None
        await self.shot(shot)
        return answer

    async def shot(self, name: str, page: Page | None = None) -> Path:
        """A full-page screenshot, `name`.png, in the test's tmp_path (and
        $CONSOLE_SCREENSHOTS/<test>/ when set)."""
        path = self.shots / f"{name}.png"
        await (page or self.page).screenshot(path=path, full_page=True)
        if self.copy_to is not None:
            self.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.copy_to / path.name)
        return path

    async def sign_in(self) -> None:
        """Through the sign-in form, as an operator does: lands on the fleet."""
        await self.goto("/console", "sign-in")
        await self.page.get_by_label("Admin token").fill(ADMIN_TOKEN)
        await self.page.get_by_role("button", name="Sign in").click()
        await self.page.wait_for_url(self.url("/console"))
        await self.shot("fleet")

    async def session_cookie(self) -> dict | None:
        return next((c for c in await self.context.cookies() if c["name"] == SESSION_COOKIE), None)

    def take_trouble(self) -> list[str]:
        """What was reported so far, forgotten (for a test that causes some on purpose)."""
        taken, self.trouble[:] = list(self.trouble), []
        return taken


@pytest.fixture
async def open_tab(browser: Browser, tmp_path, request):
    """`await open_tab(server.url, viewport=...)`: a new context and page.
    After the test: no page of any tab reported a CSP violation or a
    script error."""
    tabs: list[Tab] = []
    copy_root = os.environ.get("CONSOLE_SCREENSHOTS")
    copy_to = Path(copy_root) / request.node.name if copy_root else None

    async def open_(base_url: str, **context_options) -> Tab:
        context = await browser.new_context(**context_options)
        context.set_default_timeout(TIMEOUT_MS)
        page = await context.new_page()
        tab = Tab(base_url, context, page, tmp_path, copy_to)

        def on_console(message: ConsoleMessage) -> None:
            line = f"{message.type}: {message.text} ({message.location.get('url', '')})"
            tab.messages.append(line)
            if is_trouble(message):
                tab.trouble.append(line)

        def on_error(error) -> None:
            tab.trouble.append(f"script error: {error.error}")

        context.on("console", on_console)
        context.on("weberror", on_error)
        tabs.append(tab)
        return tab

    yield open_
    trouble = [line for tab in tabs for line in tab.trouble]
    for tab in tabs:
        try:
            await tab.context.close()
        except Error:
            pass  # the browser is already gone; the test said why
    assert not trouble, f"the browser reported: {trouble}"
