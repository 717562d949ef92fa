"""Output files: deterministic bytes generated on the fly, never stored.

Content of output `index` of task `task_id`, `size` bytes long: 64 KiB blocks,
block k = k as 8 big-endian bytes + the last 65528 bytes of a base block,
base block = SHAKE-256("longcall-sim|{task_id}|{index}") of 64 KiB; the whole
truncated to `size`. Every block differs, nothing repeats within a file,
and producing it is one memcpy per block (GiB/s), so tests can check a
download's sha256 with `output_sha256` without keeping the file.

With the `output_duration_s` control an output is a real media file instead
(app/simulator/media.py): a media header, then `output_bytes_iter(task_id,
index, n)` for the n bytes its duration takes (`output_bytes` does not
apply). `media_bytes_iter` and `media_sha256` say what such a file is, from
the same task id, index, kind (WAV or MP4) and duration; `file_size` and
`file_chunks` are what every route serves for a task's output, either way.
"""
from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import AsyncIterator, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.simulator.controls import Controls, media_of
from app.simulator.faults import roll
from app.simulator.media import WAV_RATE, media_parts, media_size, prepend
from app.simulator.state import Phase

BLOCK = 64 * 1024
_BLOCKS_PER_CHUNK = 16  # 1 MiB per yielded chunk: few, large writes to the socket


@functools.lru_cache(maxsize=256)
def _base_block(task_id: str, index: int) -> bytes:
    seed = f"longcall-sim|{task_id}|{index}".encode()
    return hashlib.shake_256(seed).digest(BLOCK)


def output_bytes_iter(task_id: str, index: int, size: int) -> Iterator[bytes]:
    """The bytes of one output, in chunks of at most 1 MiB."""
    if size < 0:
        raise ValueError("size must be >= 0")
    tail = _base_block(task_id, index)[8:]
    block_no = 0
    remaining = size
    while remaining > 0:
        parts = []
        for _ in range(_BLOCKS_PER_CHUNK):
            if remaining <= 0:
                break
            block = block_no.to_bytes(8, "big") + tail
            if remaining < BLOCK:
                block = block[:remaining]
            parts.append(block)
            remaining -= len(block)
            block_no += 1
        yield b"".join(parts)


@functools.lru_cache(maxsize=1024)
def output_sha256(task_id: str, index: int, size: int) -> str:
    """Hex sha256 of `output_bytes_iter(task_id, index, size)`."""
    digest = hashlib.sha256()
    for chunk in output_bytes_iter(task_id, index, size):
        digest.update(chunk)
    return digest.hexdigest()


def media_bytes_iter(task_id: str, index: int, kind: str, duration_s: float, *,
                     rate: int = WAV_RATE) -> Iterator[bytes]:
    """The bytes of one media output: its header, then its deterministic bytes."""
    header, size = media_parts(kind, duration_s, rate=rate)
    return prepend(header, output_bytes_iter(task_id, index, size))


@functools.lru_cache(maxsize=1024)
def media_sha256(task_id: str, index: int, kind: str, duration_s: float, *, rate: int = WAV_RATE) -> str:
    """Hex sha256 of `media_bytes_iter(task_id, index, kind, duration_s, rate=rate)`."""
    digest = hashlib.sha256()
    for chunk in media_bytes_iter(task_id, index, kind, duration_s, rate=rate):
        digest.update(chunk)
    return digest.hexdigest()


def file_size(controls: Controls) -> int:
    """The length of each output a task with these controls makes."""
    media = media_of(controls)
    return controls.output_bytes if media is None else media_size(*media)


def file_chunks(task_id: str, index: int, controls: Controls) -> Iterator[bytes]:
    """The bytes of output `index` of task `task_id`: `output_bytes` of
    deterministic bytes, or the media file `output_duration_s` asks for."""
    media = media_of(controls)
    if media is None:
        return output_bytes_iter(task_id, index, controls.output_bytes)
    return media_bytes_iter(task_id, index, *media)


async def aiter_chunks(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    # Each chunk costs microseconds to make: no need for a thread per chunk,
    # which is what StreamingResponse does with a plain iterator.
    for chunk in chunks:
        yield chunk


_NOT_FOUND = {"error": "not found"}


async def get_output(request: Request) -> Response:
    """GET/HEAD /outputs/{task_id}/{index}: the bytes while the task has
    succeeded and its outputs have not expired, 404 otherwise."""
    sim = request.app.state.sim
    if roll(sim.store.rng, sim.store.faults.download_error):
        return JSONResponse({"error": "simulated download error"}, status_code=500)
    task = sim.store.tasks.get(request.path_params["task_id"])
    try:
        index = int(request.path_params["index"])
    except ValueError:
        return JSONResponse(_NOT_FOUND, status_code=404)
    now = time.time()
    if (
        task is None
        or not 0 <= index < task.controls.outputs
        or task.phase(now) is not Phase.SUCCEEDED
        or now >= task.outputs_expire_at
    ):
        return JSONResponse(_NOT_FOUND, status_code=404)
    headers = {"content-length": str(file_size(task.controls)), "cache-control": "no-store"}
    if request.method == "HEAD":
        return Response(status_code=200, headers=headers, media_type=task.controls.content_type)
    return StreamingResponse(
        aiter_chunks(file_chunks(task.id, index, task.controls)),
        headers=headers,
        media_type=task.controls.content_type,
    )
