"""The provider simulator (`longcall sim`): a real HTTP server that behaves
like a provider — its own protocol (provider `sim`) plus Replicate's, fal's
and KIE's wire protocols under /replicate, /fal and /kie — for the demo,
tests and benchmarks. State is in memory; a task's status is computed from
the clock, and only webhook deliveries are scheduled.

What an output's bytes are: `output_sha256(task_id, index, size)` for
`output_bytes` of plain bytes, `media_sha256(task_id, index, kind,
duration_s)` ("wav" or "mp4") for a file made with `output_duration_s`."""
from app.simulator.outputs import media_bytes_iter, media_sha256, output_bytes_iter, output_sha256
from app.simulator.server import create_app, main

__all__ = ["create_app", "main", "media_bytes_iter", "media_sha256", "output_bytes_iter", "output_sha256"]
