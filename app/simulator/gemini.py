"""The simulator's /gemini protocol (being written: #12)."""
from __future__ import annotations

from starlette.routing import Route

from app.simulator.engine import Simulator
from app.simulator.state import Task
from app.simulator.webhooks import OutgoingWebhook

PROTOCOL = "gemini"
PREFIX = "/gemini"


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    return None


routes: list[Route] = []
