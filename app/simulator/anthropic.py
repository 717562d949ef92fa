"""The simulator's /anthropic protocol (being written: #13)."""
from __future__ import annotations

from starlette.routing import Route

PROTOCOL = "anthropic"
PREFIX = "/anthropic"

routes: list[Route] = []
