"""The simulator's /elevenlabs protocol (being written: #12)."""
from __future__ import annotations

from starlette.routing import Route

from app.simulator.engine import Simulator
from app.simulator.state import Task
from app.simulator.webhooks import OutgoingWebhook

PROTOCOL = "elevenlabs"
PREFIX = "/elevenlabs"


def render_webhook(sim: Simulator, task: Task, event: str, now: float) -> OutgoingWebhook | None:
    return None


routes: list[Route] = []
