"""The simulator's ASGI app and its command line."""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import NoReturn

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.config import port_argument
from app.simulator import admin, anthropic, elevenlabs, fal, gateway, gemini, kie, native, openai, replicate
from app.simulator.engine import DEFAULT_HOLD_S, Simulator
from app.simulator.outputs import get_output
from app.simulator.webhooks import DEFAULT_RETRY_DELAYS
from app.simulator.wire import hide_abort_in_server_log

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(
    *,
    webhook_retry_delays: tuple[float, ...] = DEFAULT_RETRY_DELAYS,
    hold_s: float = DEFAULT_HOLD_S,
    replicate_page_size: int = 100,
) -> Starlette:
    """A fresh simulator (its own tasks, stats, faults and keys).

    `webhook_retry_delays`: seconds before each retry of a failed webhook
    delivery; `hold_s`: how long submit_timeout_after_create holds the
    response before dropping it; `replicate_page_size`: page size of
    Replicate's prediction list."""
    sim = Simulator(
        webhook_retry_delays=webhook_retry_delays,
        hold_s=hold_s,
        replicate_page_size=replicate_page_size,
    )
    sim.renderers.update({
        native.PROTOCOL: native.render_webhook,
        replicate.PROTOCOL: replicate.render_webhook,
        fal.PROTOCOL: fal.render_webhook,
        kie.PROTOCOL: kie.render_webhook,
        gateway.PROTOCOL: gateway.render_webhook,
        gemini.PROTOCOL: gemini.render_webhook,
        elevenlabs.PROTOCOL: elevenlabs.render_webhook,
    })
    # Concurrency is counted per prefix, named as the routes are mounted.
    sim.prefixes.update({module.PROTOCOL: module.PREFIX for module in (
        native, replicate, fal, kie, gateway, gemini, elevenlabs, anthropic, openai)})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await sim.sender.aclose()

    routes = [
        *native.routes,
        *replicate.routes,
        *fal.routes,
        *kie.routes,
        *gateway.routes,
        *gemini.routes,
        *elevenlabs.routes,
        *anthropic.routes,
        *openai.routes,
        *admin.routes,
        Route("/outputs/{task_id}/{index}", get_output, methods=["GET", "HEAD"]),
    ]
    hide_abort_in_server_log()
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error})
    app.state.sim = sim
    return app


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not argparse's usage block: the CLI's errors are one line.
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """`longcall sim` / `python -m app.simulator`: serve until interrupted."""
    parser = _Parser(prog="longcall sim", description="Run the provider simulator.")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=port_argument, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    args = parser.parse_args(argv)
    config = uvicorn.Config(
        create_app(),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        # A held submit_timeout_after_create response must not stall Ctrl-C.
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind; it has logged why
        return exc.code if isinstance(exc.code, int) else 1
    return 0 if server.started else 1
