"""The client against a real longcall (clients/testing/serve_longcall.py):
every test runs with the sync Client and the AsyncClient (`api` is either)."""
from __future__ import annotations

import hashlib
import time
import uuid

import pytest
from client_support import FAILS, FAST, POOL_CREDITS, SLOW, WAIT_S
from longcall_client import DownloadedOutput, Job


async def test_create_wait_download(api, tmp_path):
    created = await api.jobs.create("sim", "image-fast", {**FAST, "output_bytes": 200_000}, max_credits=10)
    assert isinstance(created, Job)
    assert created.id.startswith("job_") and created.status in ("queued", "submitting", "running")
    assert created.credits.reserved == 10 and created.created_at is not None
    assert created.raw["id"] == created.id  # the JSON itself stays reachable

    job = await api.jobs.wait(created.id, WAIT_S)
    assert job.status == "succeeded", job.raw
    assert job.terminal and job.finished_at is not None and job.error is None
    assert job.credits.charged == 1 and job.credits.refunded == 9  # the simulator's default cost
    [output] = job.outputs
    assert output.index == 0 and output.bytes == 200_000 and output.content_type == "image/png"

    path = tmp_path / "out.png"
    saved = await api.jobs.download(job.id, 0, path)
    assert isinstance(saved, DownloadedOutput)
    data = path.read_bytes()
    assert len(data) == output.bytes == saved.bytes
    assert hashlib.sha256(data).hexdigest() == output.sha256 == saved.sha256
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]  # no part file left behind


async def test_a_failed_job_is_refunded(api):
    job = await api.jobs.wait((await api.jobs.create("sim", "image-fast", FAILS, max_credits=7)).id, WAIT_S)
    assert job.status == "failed"
    assert job.error is not None and job.error.code == "provider_failed"
    assert job.credits.charged == 0 and job.credits.refunded == 7
    assert job.outputs == []


async def test_wait_returns_a_running_job_when_the_time_is_up(api):
    job = await api.jobs.create("sim", "image-slow", SLOW, max_credits=5)
    started = time.monotonic()
    waited = await api.jobs.wait(job.id, 1.5)
    took = time.monotonic() - started
    assert not waited.terminal and waited.id == job.id
    assert 1.5 <= took < 30  # it did wait, and not for the job (600 s)
    await api.jobs.cancel(job.id)


async def test_get(api):
    job = await api.jobs.create("sim", "image-fast", FAST, max_credits=3)
    again = await api.jobs.get(job.id)
    assert again.id == job.id and again.input == FAST and again.provider == "sim" and again.model == "image-fast"
    assert again.status_url.startswith(f"/v1/jobs/{job.id}?token=")
    await api.jobs.cancel(job.id)  # done with it: no need to spend the time it takes to finish


async def test_the_same_key_twice_is_the_same_job(api):
    key = f"test-{uuid.uuid4()}"
    first = await api.jobs.create("sim", "image-fast", FAST, max_credits=3, idempotency_key=key)
    second = await api.jobs.create("sim", "image-fast", FAST, max_credits=3, idempotency_key=key)
    assert second.id == first.id
    await api.jobs.cancel(first.id)


async def test_a_generated_key_is_fresh_per_create(make_owner, make_api):
    owner = make_owner()
    mine = make_api(owner.api_key)
    one = await mine.jobs.create("sim", "image-slow", SLOW, max_credits=3)
    two = await mine.jobs.create("sim", "image-slow", SLOW, max_credits=3)
    assert one.id != two.id  # the same payload, two creates: two jobs
    assert (await mine.account.get()).credits.reserved == 6
    for job in (one, two):
        await mine.jobs.cancel(job.id)


async def test_list_pages_and_iterate(make_owner, make_api):
    mine = make_api(make_owner().api_key)
    created = [await mine.jobs.create("sim", "image-fast", {**FAST, "n": n}, max_credits=2) for n in range(5)]
    newest_first = [job.id for job in reversed(created)]

    page = await mine.jobs.list(limit=2)
    assert [j.id for j in page.jobs] == newest_first[:2] and page.next_cursor
    page2 = await mine.jobs.list(limit=2, cursor=page.next_cursor)
    assert [j.id for j in page2.jobs] == newest_first[2:4] and page2.next_cursor
    page3 = await mine.jobs.list(limit=2, cursor=page2.next_cursor)
    assert [j.id for j in page3.jobs] == newest_first[4:] and page3.next_cursor is None

    assert [j.id for j in await mine.all_jobs(page_size=2)] == newest_first
    assert [j.id for j in await mine.all_jobs()] == newest_first

    for job in created:
        await mine.jobs.wait(job.id, WAIT_S)
    assert [j.id for j in await mine.all_jobs(status="succeeded", page_size=3)] == newest_first
    assert await mine.all_jobs(status="running") == []


async def test_cancel_refunds_and_cancel_twice_is_invalid_state(make_owner, make_api):
    from longcall_client import InvalidState

    mine = make_api(make_owner().api_key)
    job = await mine.jobs.create("sim", "image-slow", SLOW, max_credits=40)
    assert (await mine.account.get()).credits.reserved == 40
    cancelled = await mine.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.credits.refunded == 40 and cancelled.credits.charged == 0
    account = await mine.account.get()
    assert account.credits.balance == POOL_CREDITS and account.credits.reserved == 0 and account.active == 0
    with pytest.raises(InvalidState) as caught:
        await mine.jobs.cancel(job.id)
    assert caught.value.status == 409 and caught.value.code == "invalid_state"


async def test_account_adds_up(make_owner, make_api):
    owner = make_owner(credits=50, max_active=4)
    mine = make_api(owner.api_key)
    before = await mine.account.get()
    assert before.owner_id == owner.owner_id and before.max_active == 4
    assert (before.credits.balance, before.credits.reserved, before.credits.charged) == (50, 0, 0)
    job = await mine.jobs.create("sim", "image-fast", {**FAST, "cost": 3}, max_credits=20)
    during = await mine.account.get()
    assert during.credits.balance + during.credits.reserved + during.credits.charged == 50
    await mine.jobs.wait(job.id, WAIT_S)
    after = await mine.account.get()
    assert (after.credits.balance, after.credits.reserved, after.credits.charged, after.active) == (47, 0, 3, 0)


async def test_models_list(api):
    # Without a MODELS_FILE the server lists no entries; the call and its shape still work.
    assert await api.models.list() == []
