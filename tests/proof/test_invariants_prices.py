"""The invariants on prices (the models file, app/pricing.py): a system
whose succeeded jobs were each charged their price on what they used — per
provider cost, per output, per second of stored media (real MP4s and a
WAV), per 1k tokens, per 1k characters, capped at the reservation, one
whose media no reader knows, one with no price — passes; broken one way at
a time (a record that disagrees with the charge, a measure that is not the
provider's, media replaced, a charge by another price), the money and price
checks fail and nothing else does."""
from __future__ import annotations

import hashlib
import json
import os
from decimal import Decimal

import pytest

from app import media, pricing
from app.domain import jobs
from app.models_file import Price, parse
from app.providers.base import Usage, UsageUnit
from app.simulator.media import MP4, WAV
from app.simulator.outputs import media_bytes_iter, output_bytes_iter
from app.storage import FileStorage, object_key
from app.vocabulary import JobStatus
from proof import invariants

MONEY = "per job: reserved = charged + refunded"
PRICES = "each charge its price on what was measured"
SPEECH = "text-to-speech/JBFqnCBsd6RMkjVDRZzb"
MODELS_TOML = """
[[models]]
provider = "sim"
model = "image-*"
price = { credits = 1, per = "provider" }

[[models]]
provider = "fal"
model = "fal-ai/flux/*"
price = { credits = 3, per = "output" }

[[models]]
provider = "kie"
model = "veo/*"
price = { credits = 1.5, per = "second" }

[[models]]
provider = "anthropic"
model = "claude-*"
price = { credits = 2, per = "1k_tokens" }

[[models]]
provider = "elevenlabs"
model = "text-to-speech/*"
price = { credits = 20, per = "1k_characters" }

[[models]]
provider = "elevenlabs"
model = "sound-generation"
price = { credits = 2, per = "second" }
"""
MODELS = parse(MODELS_TOML)
RESERVED = 10


async def _store(storage: FileStorage, index: int, key: str, data: bytes, content_type: str) -> tuple[jobs.Asset, str]:
    """The output stored as the settler stores it, and its local copy (what the settler measures)."""
    path = os.path.join(storage.root, f"upload-{hashlib.sha256(key.encode()).hexdigest()[:8]}")
    with open(path, "wb") as f:
        f.write(data)
    sha = hashlib.sha256(data).hexdigest()
    await storage.put_file(key, path, content_type, sha, len(data))
    return jobs.Asset(index, key, len(data), sha, content_type), path


class Made:
    """A job to take to success as the settler does."""

    def __init__(self, name: str, provider: str, model: str, input_: dict, outputs: list[tuple[bytes, str]], *,
                 usage: tuple[Usage, ...] = (), cost: int | None = None, sync: bool = False):
        self.name, self.provider, self.model, self.input = name, provider, model, input_
        self.outputs, self.usage, self.cost, self.sync = outputs, usage, cost, sync


def _mp4s(task: str, n: int, seconds: float) -> list[tuple[bytes, str]]:
    return [(b"".join(media_bytes_iter(task, i, MP4, seconds)), "video/mp4") for i in range(n)]


def _plan() -> list[Made]:
    text = "chaos job 5" + " word" * 60  # 311 characters: 20 per 1k is 6.22, so 7
    return [
        Made("sim", "sim", "image-fast", {"cost": 4, "outputs": 1, "output_bytes": 300},
             [(b"".join(output_bytes_iter("task-sim", 0, 300)), "image/png")], cost=4),
        Made("fal", "fal", "fal-ai/flux/dev", {"outputs": 2, "output_bytes": 200},
             [(b"".join(output_bytes_iter("task-fal", i, 200)), "image/png") for i in range(2)]),
        # 2 x 1.5 s at 1.5 a second: 4.5, so 5
        Made("veo", "kie", "veo/veo3_fast", {"outputs": 2, "output_duration_s": 1.5}, _mp4s("task-veo", 2, 1.5)),
        # 3 x 3 s: 13.5 credits, capped at the reservation
        Made("veo_capped", "kie", "veo/veo3_fast", {"outputs": 3, "output_duration_s": 3.0},
             _mp4s("task-veo_capped", 3, 3.0)),
        # no output_duration_s: bytes no media reader knows, charged the reservation
        Made("veo_unreadable", "kie", "veo/veo3_fast", {"outputs": 1, "output_bytes": 400},
             [(b"".join(output_bytes_iter("task-veo_unreadable", 0, 400)), "video/mp4")]),
        # 3000 + 40 tokens at 2 per 1k: 6.08, so 7
        Made("claude", "anthropic", "claude-sonnet-4-5",
             {"max_tokens": 64, "messages": [{"role": "user", "content": "chaos job 4"}],
              "metadata": {"input_tokens": 3000, "output_tokens": 40}},
             [(json.dumps({"type": "message", "content": []}).encode(), "application/json")],
             usage=(Usage(UsageUnit.INPUT_TOKENS, 3000), Usage(UsageUnit.OUTPUT_TOKENS, 40)), sync=True),
        Made("speech", "elevenlabs", SPEECH, {"text": text, "model_id": "eleven_multilingual_v2", "output_bytes": 500},
             [(b"".join(output_bytes_iter("req-speech", 0, 500)), "audio/mpeg")],
             usage=(Usage(UsageUnit.CHARACTERS, len(text)),), sync=True),
        # a 2.5 s WAV at 2 a second: 5
        Made("sound", "elevenlabs", "sound-generation", {"text": "chaos job 7", "output_duration_s": 2.5},
             [(b"".join(media_bytes_iter("req-sound", 0, WAV, 2.5, rate=44100)), "audio/wav")],
             usage=(Usage(UsageUnit.CHARACTERS, 50),), sync=True),
        # no price: charged the reservation (Replicate reports no cost)
        Made("replicate", "replicate", "black-forest-labs/flux-schnell", {"outputs": 1, "output_bytes": 100},
             [(b"".join(output_bytes_iter("task-replicate", 0, 100)), "image/png")]),
    ]


async def _succeed(pool, storage: FileStorage, owner_id: str, n: int, made: Made) -> str:
    """Claimed, submitted (its task saved, or its call started), its outputs
    stored, then closed with the charge app.pricing makes of what the
    settler measured: outputs, the local copies' seconds, the usage."""
    created = await jobs.create_job(pool, owner_id=owner_id, request_key=f"p{n}", provider=made.provider,
                                    model=made.model, input=made.input, max_credits=RESERVED, give_up_after_s=3600)
    job_id = created.job_id
    async with pool.acquire() as conn:
        assert await jobs.begin_submit(conn, job_id)
        if made.sync:
            assert await jobs.start_call(conn, job_id)
        else:
            assert await jobs.save_task(conn, job_id, task_id=f"task-{made.name}", operation=None,
                                        webhook_secret=None, callback_registered=False,
                                        first_check_after_s=30) is jobs.Saved.RUNNING
        assets, paths = [], []
        for index, (data, content_type) in enumerate(made.outputs):
            key = object_key(owner_id, job_id, index)
            asset, path = await _store(storage, index, key, data, content_type)
            assets.append(asset)
            paths.append((path, content_type))
        entry = MODELS.match(made.provider, made.model)
        price = entry.price if entry is not None else None
        seconds = media.summed_duration_s(paths) if price is not None and price.per == "second" else None
        charged = pricing.charge(price, RESERVED, pricing.Measures(len(assets), seconds=seconds, usage=made.usage,
                                                                    provider_cost=made.cost))
        usage = [{"unit": u.unit.value, "amount": u.amount} for u in made.usage] or None
        operation = {"request_id": f"req-{made.name}"} if made.sync else None
        assert await jobs.close(conn, job_id, JobStatus.SUCCEEDED, charge=charged.credits, assets=assets,
                                usage=usage, operation=operation, price_applied=charged.applied,
                                from_statuses=(JobStatus.SUBMITTING,) if made.sync else None)
    return job_id


@pytest.fixture
async def system(db, make_owner, tmp_objects):
    storage = FileStorage(str(tmp_objects))
    owner = await make_owner(credits=1000, max_active=20)
    made = {m.name: await _succeed(db, storage, owner.owner_id, n, m) for n, m in enumerate(_plan())}
    stats = {"tasks_created": 0, "sync_calls_by_body": {hashlib.sha256(name.encode()).hexdigest(): 1
                                                        for name in ("claude", "speech", "sound")}}
    return db, storage, owner.owner_id, made, stats


async def _checks(db, storage, stats, models=MODELS) -> dict[str, invariants.Check]:
    async with db.acquire() as conn:
        return {c.name: c for c in await invariants.system_checks(conn, sim_stats=stats, storage=storage,
                                                                 models=models)}


async def _failing(db, storage, stats, models=MODELS) -> set[str]:
    # Without the timeline check: these tests change a job's row by hand, so
    # its timeline (which recorded the truth) disagrees too. That check has
    # its own tests (test_invariants_timeline.py).
    return {name for name, c in (await _checks(db, storage, stats, models)).items()
            if c.violations and name != invariants.TIMELINE_CHECK}


async def test_a_system_charged_its_prices_passes(system):
    db, storage, _, made, stats = system
    checks = await _checks(db, storage, stats)
    assert {name for name, c in checks.items() if c.violations} == set(), invariants.format_table(checks.values())
    assert checks[PRICES].checked == len(made)
    assert checks[PRICES].note == ("1 per 1k_characters, 1 per 1k_tokens, 1 per output, 1 per provider, "
                                   "4 per second; 1 capped at the reservation, 1 unreadable (charged the reservation)")
    charged = {name: await db.fetchval("select credits_charged from jobs where id = $1", job_id)
               for name, job_id in made.items()}
    # The charges the prices make, worked out by hand (not vacuous: each differs from the reservation
    # but the capped, the unreadable and the unpriced one).
    assert charged == {"sim": 4, "fal": 6, "veo": 5, "veo_capped": 10, "veo_unreadable": 10, "claude": 7,
                       "speech": 7, "sound": 5, "replicate": 10}


async def test_without_the_models_file_the_priced_charges_are_wrong(system):
    """Held to no prices (every job charged the provider's cost or the
    reservation), the priced jobs' charges and records are found out."""
    db, storage, _, _, stats = system
    assert await _failing(db, storage, stats, models=parse("")) == {MONEY, PRICES}


def _record(field: str, value) -> str:
    return f"update jobs set price_applied = jsonb_set(price_applied, '{{{field}}}', '{json.dumps(value)}') " \
           "where id = $1"


@pytest.mark.parametrize("sql, job", [
    # the record says another charge than the job's
    (_record("charged", 5), "fal"),
    # the record's measure is not what was stored (3 outputs, not 2): ceil(3 x 3) is not the charge
    (_record("measure", 3), "fal"),
    # the record names another price than the models file's
    (_record("price", {"credits": 4, "per": "output"}), "fal"),
    # the record's reservation is not the job's
    (_record("reserved", 12), "sim"),
    # no record for a priced job
    ("update jobs set price_applied = null where id = $1", "claude"),
    # the record says the seconds could not be read, yet the stored MP4s play 3.0 s
    ("update jobs set price_applied = price_applied || '{\"measure\": null}' where id = $1", "veo"),
    # a job without a price whose record names one
    (_record("price", {"credits": 1, "per": "job"}), "replicate"),
    # usage recorded that is not what the provider reported (its measure agrees with the record)
    ("update jobs set usage = '[{\"unit\": \"input_tokens\", \"amount\": 2000}, "
     "{\"unit\": \"output_tokens\", \"amount\": 40}]' where id = $1", "claude"),
])
async def test_a_record_that_disagrees(system, sql, job):
    db, storage, _, made, stats = system
    await db.execute(sql, made[job])
    assert await _failing(db, storage, stats) == {PRICES}


async def _move_credit(db, job_id: str, credits: int) -> None:
    """Charge `credits` more (or less) and refund that less, everywhere
    money is kept: the job, its ledger, its owner. The money balances;
    only the price can tell."""
    await db.execute("update jobs set credits_charged = credits_charged + $2, "
                     "credits_refunded = credits_refunded - $2 where id = $1", job_id, credits)
    await db.execute("update ledger set amount = amount + $2 where job_id = $1 and kind = 'charge'", job_id, credits)
    refunded = await db.execute("update ledger set amount = amount - $2 where job_id = $1 and kind = 'refund'",
                                job_id, credits)
    if refunded == "UPDATE 0":  # it refunded nothing until now
        await db.execute("insert into ledger (owner_id, job_id, kind, amount) "
                         "select owner_id, id, 'refund', $2 from jobs where id = $1", job_id, -credits)
    await db.execute("update owners set charged = charged + $2, balance = balance - $2 "
                     "where id = (select owner_id from jobs where id = $1)", job_id, credits)


@pytest.mark.parametrize("job", ["sim", "fal", "veo", "claude", "speech", "sound"])
async def test_a_charge_that_is_not_its_price(system, job):
    """One credit more, with the record saying so too: the money balances,
    the price on what was used does not."""
    db, storage, _, made, stats = system
    await _move_credit(db, made[job], 1)
    await db.execute("update jobs set price_applied = jsonb_set(price_applied, '{charged}', "
                     "to_jsonb(credits_charged)) where id = $1", made[job])
    assert await _failing(db, storage, stats) == {MONEY, PRICES}


async def test_an_unpriced_charge_is_held_to_the_provider_cost(system):
    db, storage, _, made, stats = system
    await _move_credit(db, made["replicate"], -1)
    assert await _failing(db, storage, stats) == {MONEY, PRICES}  # its record still says 10


async def _replace(db, storage: FileStorage, job_id: str, index: int, data: bytes) -> None:
    """A stored output's bytes changed, the asset row updated to match (the
    outputs check sees a consistent object)."""
    key = await db.fetchval("select storage_key from assets where job_id = $1 and index = $2", job_id, index)
    with open(storage.path_of(key), "wb") as f:
        f.write(data)
    await db.execute("update assets set bytes = $3, sha256 = $4 where job_id = $1 and index = $2", job_id, index,
                     len(data), hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("data", [
    b"".join(media_bytes_iter("task-veo", 0, MP4, 0.5)),  # a shorter video: 2.0 s in all, not 3.0
    b"".join(output_bytes_iter("task-veo", 0, 300)),  # bytes no reader knows: the measure unreadable
])
async def test_stored_media_that_is_not_what_was_charged(system, data):
    db, storage, _, made, stats = system
    await _replace(db, storage, made["veo"], 0, data)
    assert await _failing(db, storage, stats) == {MONEY, PRICES}


# --- the pure rules ------------------------------------------------------------------

PER_OUTPUT = Price(Decimal(3), "output")


@pytest.mark.parametrize("applied, price, charged, measure, problems", [
    ({"price": {"credits": 3, "per": "output"}, "reserved": 10, "measure": 2, "charged": 6}, PER_OUTPUT, 6,
     Decimal(2), 0),
    # capped: ceil(3 x 4) = 12 over the reservation
    ({"price": {"credits": 3, "per": "output"}, "reserved": 10, "measure": 4, "charged": 10}, PER_OUTPUT, 10,
     Decimal(4), 0),
    ({"price": {"credits": 3, "per": "output"}, "reserved": 10, "measure": 4, "charged": 12}, PER_OUTPUT, 12,
     Decimal(4), 1),  # over the reservation
    ({"price": {"credits": 3, "per": "output"}, "reserved": 10, "measure": None, "charged": 10}, PER_OUTPUT, 10,
     None, 0),
    ({"price": {"credits": 3, "per": "output"}, "reserved": 10, "measure": None, "charged": 6}, PER_OUTPUT, 6,
     None, 1),  # unreadable yet not the reservation
    ({"price": {"credits": "3", "per": "output"}, "reserved": 10, "measure": 2, "charged": 6}, PER_OUTPUT, 6,
     Decimal(2), 1),  # a price named as text
    ({"price": {"credits": 1.5, "per": "second"}, "reserved": 10, "measure": 4.8, "charged": 8},
     Price(Decimal("1.5"), "second"), 8, Decimal("4.8"), 0),
    ({"price": {"credits": 1.5, "per": "second"}, "reserved": 10, "measure": 4.8, "charged": 7},
     Price(Decimal("1.5"), "second"), 7, Decimal("4.8"), 1),  # rounded down, not up
    (None, None, 10, None, 0),  # no price, no record
    ({"price": None, "charged": 10, "reserved": 10, "by": "the reservation"}, None, 10, None, 0),
    ({"price": None, "charged": 10, "reserved": 10, "by": "the reservation"}, None, 9, None, 1),
])
def test_price_record_problems(applied, price, charged, measure, problems):
    assert len(invariants.price_record_problems(applied, price, 10, charged, measure)) == problems


@pytest.mark.parametrize("provider, model, input_, recorded, usage", [
    ("anthropic", "claude-x", {"metadata": {"input_tokens": 7, "output_tokens": 3}}, (),
     (Usage(UsageUnit.INPUT_TOKENS, 7.0), Usage(UsageUnit.OUTPUT_TOKENS, 3.0))),
    # OpenAI's metadata holds strings
    ("openai", "gpt-x", {"metadata": {"input_tokens": "7", "output_tokens": "3"}}, (),
     (Usage(UsageUnit.INPUT_TOKENS, 7.0), Usage(UsageUnit.OUTPUT_TOKENS, 3.0))),
    # without both counts: the simulator's estimate, as recorded
    ("anthropic", "claude-x", {"metadata": {"input_tokens": 7}}, (Usage(UsageUnit.INPUT_TOKENS, 2.0),),
     (Usage(UsageUnit.INPUT_TOKENS, 2.0),)),
    ("elevenlabs", SPEECH, {"text": "hello"}, (), (Usage(UsageUnit.CHARACTERS, 5.0),)),
    # a sound effect too: the text's characters, whatever was recorded (its
    # character-cost, ElevenLabs' credits for its length, is not the measure)
    ("elevenlabs", "sound-generation", {"text": "hello"}, (Usage(UsageUnit.CHARACTERS, 100.0),),
     (Usage(UsageUnit.CHARACTERS, 5.0),)),
])
def test_the_usage_a_provider_reported(provider, model, input_, recorded, usage):
    assert invariants.provider_usage(provider, model, input_, recorded) == usage


def test_measure_problems_of_media_and_usage():
    seconds = pricing.Measures(2, seconds=3.0)
    assert invariants.measure_problems("kie", "veo/x", {"output_duration_s": 1.5}, "second", seconds, (), 2) == []
    assert invariants.measure_problems("kie", "veo/x", {"output_duration_s": 2.0}, "second", seconds, (), 2)
    assert invariants.measure_problems("kie", "veo/x", {"output_duration_s": 1.5}, "second",
                                       pricing.Measures(2), (), 2)  # none read
    assert invariants.measure_problems("kie", "veo/x", {}, "second", pricing.Measures(1), (), 0) == []
    tokens = pricing.Measures(1, usage=(Usage(UsageUnit.INPUT_TOKENS, 7.0), Usage(UsageUnit.OUTPUT_TOKENS, 3.0)))
    kept = (Usage(UsageUnit.INPUT_TOKENS, 7.0), Usage(UsageUnit.OUTPUT_TOKENS, 3.0))
    assert invariants.measure_problems("openai", "m", {}, "1k_tokens", tokens, kept, 0) == []
    assert invariants.measure_problems("openai", "m", {}, "1k_tokens", tokens, kept[:1], 0)
