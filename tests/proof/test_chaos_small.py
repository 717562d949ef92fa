"""The chaos run, small: the real processes (PostgreSQL, simulator, web, two
settlers), a few hundred jobs under simulator faults, priced and capped by
the run's models file and MAX_IN_FLIGHT_FAL, a quarter of them through a
platform acting for its owners, one settler and one web server
SIGKILLed and PostgreSQL restarted — then every invariant holds.

And the checks themselves can fail: each one is shown a database (or
simulator count, or storage object) broken the way it guards against."""
from __future__ import annotations

import hashlib
import os

from app.domain import jobs
from app.simulator.outputs import output_bytes_iter, output_sha256
from app.storage import FileStorage, object_key
from app.vocabulary import JobStatus
from proof import invariants
from proof.chaos import ChaosConfig, run_chaos


async def test_small_chaos_run_keeps_every_invariant():
    lines: list[str] = []
    config = ChaosConfig(
        jobs=200, create_rate=80, clients=12,
        kill_interval_s=(1.0, 2.0), max_kills=2, min_settler_kills=1, min_web_kills=1,
        restart_postgres_at=0.5, long_duration_s=(4.0, 8.0),
        # A killed settler's claims come back when their lease ends; a lost
        # webhook waits for the stale check or a polling read (road 2).
        settler_lease_s=10, stale_after_s=10, poll_share=0.3, poll_for_s=30,
        give_up_after_s_fal=None, drain_timeout_s=100, progress_every_s=15,
        # Caps sized to pass their jobs in 50 s (not 30): small enough that
        # each binds however the load falls on a busy machine.
        cap_drain_s=50)
    result = await run_chaos(config, out=lines.append)
    report = "\n".join(lines)
    assert result.ok, report
    assert result.kills["settler"] == 1 and result.kills["web"] == 1, report
    assert result.kills["postgres restart"] == 1, report
    by_name = {c.name: c for c in result.checks}
    # Not vacuous: jobs went through and outputs were checked.
    assert by_name["every job terminal or uncertain (intact)"].checked >= 150, report
    assert result.statuses["succeeded"] >= 100, report
    assert by_name["succeeded outputs stored with their sha256 and size"].checked >= 100, report
    # Priced and capped (issue #14): most successes were charged a price on
    # what was measured, and every cap was full with jobs waiting at times,
    # yet never exceeded (by the simulator's peak and the database samples).
    assert "per second" in by_name["each charge its price on what was measured"].note, report
    assert by_name["each charge its price on what was measured"].checked >= 100, report
    assert by_name["no provider had more in flight than its cap (simulator)"].checked == 2, report
    assert {t.cap.provider for t in result.caps} == {"fal", "sim", "elevenlabs"}, report
    assert all(t.bound for t in result.caps if t.cap.provider != "elevenlabs"), report
    # Notifications (issue "Tell the app"): delivered through failing and slow endpoints, none left pending.
    tally = result.notifications
    assert tally is not None and tally.delivered >= 150 and tally.pending == 0, report
    assert result.receivers["failing"][500] >= 100 and result.receivers["slow"][204] >= 20, report
    # A platform acting for 20 owners it made (Apps with many users): a quarter of the jobs, and its
    # grants, claw-backs and refused claw-backs raced the creates; replays moved nothing (the ledger
    # checks above say so); its own endpoint got its owners' notifications.
    platform = result.platform
    assert platform["grants moved"] >= 25 and platform["claw-backs moved"] >= 1, report
    assert platform["claw-backs refused"] >= 1 and platform["replays answered 200"] >= 1, report
    assert by_name["a platform's owners are the ones it made, each job its owner's"].checked >= 150, report
    assert tally.to_platforms >= 30, report


# --- the checks catch what they guard against -----------------------------------------

CALLBACK = "http://127.0.0.1:9/webhooks/sim/{}"


async def _succeeded_job(pool, storage: FileStorage, owner_id: str, n: int) -> str:
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=f"k{n}", provider="sim",
                                    model="m", input={"outputs": 1, "output_bytes": 300, "cost": 2},
                                    max_credits=10, give_up_after_s=3600)
    job_id = created.job_id
    task_id = f"task-{n}"
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, job_id)
        assert await jobs.save_task(conn, job_id, task_id=task_id, operation=None, webhook_secret=b"x",
                                    callback_registered=True, first_check_after_s=30) is jobs.Saved.RUNNING
        key = object_key(owner_id, job_id, 0)
        path = os.path.join(storage.root, "upload")
        with open(path, "wb") as f:
            for chunk in output_bytes_iter(task_id, 0, 300):
                f.write(chunk)
        sha = output_sha256(task_id, 0, 300)
        await storage.put_file(key, path, "image/png", sha, 300)
        assert await jobs.close(conn, job_id, JobStatus.SUCCEEDED, charge=2,
                                assets=[jobs.Asset(0, key, 300, sha, "image/png")])
    return job_id


async def test_invariants_catch_broken_state(db, make_owner, tmp_objects):
    storage = FileStorage(str(tmp_objects))
    owner = await make_owner(credits=100, max_active=10)
    done = [await _succeeded_job(db, storage, owner.owner_id, n) for n in range(3)]
    stats = {"tasks_created": 3, "creates_by_idempotency_key": {j: 1 for j in done},
             "creates_by_callback_url": {CALLBACK.format(j): 1 for j in done}}

    async def failing() -> set[str]:
        async with db.acquire() as conn:
            checks = await invariants.system_checks(conn, sim_stats=stats, storage=storage)
        return {c.name for c in checks if c.violations}

    assert await failing() == set()

    # A second task for one job, at the provider.
    stats["creates_by_callback_url"][CALLBACK.format(done[0])] = 2
    stats["tasks_created"] = 4
    assert await failing() == {"one provider task per job"}
    stats["creates_by_callback_url"][CALLBACK.format(done[0])] = 1
    stats["tasks_created"] = 3

    # An output whose stored bytes changed.
    with open(storage.path_of(object_key(owner.owner_id, done[1], 0)), "r+b") as f:
        f.write(b"!")
    assert await failing() == {"succeeded outputs stored with their sha256 and size"}
    await db.execute("update assets set sha256 = $2 where job_id = $1", done[1],
                     hashlib.sha256(open(storage.path_of(object_key(owner.owner_id, done[1], 0)), "rb")
                                    .read()).hexdigest())
    # ...recorded as stored, but not the provider's bytes (nor what its timeline says was stored)
    assert await failing() == {"succeeded outputs stored with their sha256 and size", invariants.TIMELINE_CHECK}
    await db.execute("delete from assets where job_id = $1", done[1])
    assert await failing() == {"succeeded outputs stored with their sha256 and size", invariants.TIMELINE_CHECK}

    # A settle intent left on a closed job; a provider cancel that never drains.
    await db.execute("insert into outbox (job_id, kind) values ($1, 'settle')", done[2])
    assert "no intent left for a terminal job" in await failing()
    await db.execute("delete from outbox")
    await db.execute("insert into outbox (job_id, kind) values ($1, 'cancel')", done[2])
    assert "no intent left for a terminal job" not in await failing()  # may still be draining
    await db.execute("update jobs set finished_at = now() - interval '1 hour' where id = $1", done[2])
    assert "no intent left for a terminal job" in await failing()
    await db.execute("delete from outbox")

    # A slot not given back; money moved between owner counters.
    await db.execute("update owners set active = active + 1 where id = $1", owner.owner_id)
    assert "active slots = jobs in flight, per owner" in await failing()
    await db.execute("update owners set reserved = reserved + 1, charged = charged - 1 where id = $1",
                     owner.owner_id)
    assert "per owner: granted = balance + reserved + charged" in await failing()

    # A refund that the ledger lost; a job left running.
    await db.execute("delete from ledger where job_id = $1 and kind = 'refund'", done[2])
    assert "per job: reserved = charged + refunded" in await failing()
    created = await jobs.create_job(db, owner_id=owner.owner_id, request_key="stuck", provider="sim",
                                    model="m", input={}, max_credits=1, give_up_after_s=3600)
    assert "every job terminal or uncertain (intact)" in await failing()

    # What a client was told, held against the database.
    async with db.acquire() as conn:
        told = {"k0": done[0], "stuck": created.job_id}
        assert (await invariants.accepted_creates_are_jobs(conn, told, [])).violations  # k1, k2 untold
        assert (await invariants.client_cancels_held(conn, [done[0]])).violations
        assert (await invariants.reads_agree(conn, {done[0]: "failed"})).violations
        assert not (await invariants.reads_agree(conn, {done[0]: "succeeded"})).violations


def test_secrets_not_logged_finds_a_leak(tmp_path):
    secret = "s3cr3t-" + "x" * 40
    clean, leaky = tmp_path / "web.log", tmp_path / "settler.log"
    clean.write_text('{"msg": "key lc_abcdefghi revoked"}\n')
    leaky.write_text('{"msg": "ok"}\n{"msg": "calling with token ' + secret + '"}\n')
    assert invariants.secrets_not_logged([str(clean)], {"SECRET_KEY": secret}).ok
    found = invariants.secrets_not_logged([str(clean), str(leaky)], {"SECRET_KEY": secret})
    assert found.violations == ["settler.log:2 shows SECRET_KEY"] and found.checked == 3
