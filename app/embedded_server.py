"""A uvicorn server run inside a process that owns its own signals.

`longcall dev` (web beside the settler) and the settler's metrics endpoint
run uvicorn as one task among others; left alone, uvicorn takes SIGINT and
SIGTERM over with signal.signal while it serves, and the process's own
graceful stop (a settler draining its claims) never hears them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the process handles SIGINT/SIGTERM itself and calls should_exit
