"""The simulator's /openai protocol (being written: #13)."""
from __future__ import annotations

from starlette.routing import Route

PROTOCOL = "openai"
PREFIX = "/openai"

routes: list[Route] = []
