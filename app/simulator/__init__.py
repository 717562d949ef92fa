"""The provider simulator (`longcall sim`): a real HTTP server that behaves
like a provider — its own protocol (provider `sim`) plus Replicate's, fal's
and KIE's wire protocols under /replicate, /fal and /kie — for the demo,
tests and benchmarks. State is in memory; a task's status is computed from
the clock, and only webhook deliveries are scheduled."""
from app.simulator.outputs import output_bytes_iter, output_sha256
from app.simulator.server import create_app, main

__all__ = ["create_app", "main", "output_bytes_iter", "output_sha256"]
