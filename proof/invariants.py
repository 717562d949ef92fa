"""DESIGN.md's invariants as checks over a finished (quiet) system.

Each check reads the database (and, where it needs them, the simulator's
`/_sim/stats` or the object storage) and returns a `Check`: its name, how
many things it looked at, and one line per violation (naming the job or
owner). They are meant to run when nothing is moving any more — after the
chaos run has drained, or at the end of a test — so each check reads what
it needs without a snapshot transaction.

The client-side checks at the end take what a client recorded (answers it
got) and hold the database to it: an accepted create is a job, a cancel
answered 200 is a cancelled job, a terminal status a client read is the
job's final status.

Prices and caps (the models file, CONTRACT.md): a succeeded job with a
price is charged it on what the provider did (`succeeded_charges` measures
it again: outputs stored, the seconds of the stored media read back from
storage by app.media, the tokens and characters the simulator was told to
report), and its `price_applied` record agrees; no provider ever had more in
flight than a cap, by the simulator's own `peak_concurrent` where a cap
covers a whole protocol prefix, and by samples of the database taken while
the run went on (`CapTally`).

Notifications (CONTRACT.md: Notifications to the client): each notified
transition has one notification with one delivery per endpoint that asked
for it, delivered or still within its 24 h, and what the run's receivers
got agrees (`notification_problems`, pure, over rows `notifications_kept`
reads).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, NamedTuple

from app import media, pricing
from app.delivery import LAST_ATTEMPT_LATE_S, SEND_TIMEOUT_S
from app.domain import states
from app.models_file import NO_MODELS, ModelsFile, Price
from app.providers import provider_kind
from app.providers.base import ELEVENLABS_SOUND_MODEL, ELEVENLABS_SPEECH_PREFIX, Usage, UsageUnit
from app.simulator import anthropic as sim_anthropic
from app.simulator import elevenlabs as sim_elevenlabs
from app.simulator import fal as sim_fal
from app.simulator import gateway as sim_gateway
from app.simulator import gemini as sim_gemini
from app.simulator import kie as sim_kie
from app.simulator import native as sim_native
from app.simulator import openai as sim_openai
from app.simulator import replicate as sim_replicate
from app.simulator.outputs import output_sha256
from app.storage import ObjectNotFound, Storage, StorageError, object_key
from app.vocabulary import (
    IN_FLIGHT,
    SUBMITTED,
    TERMINAL,
    DeliveryStatus,
    EventType,
    IntentKind,
    JobStatus,
    NotificationType,
    ProviderKind,
    ProviderName,
)

JOB_ID_IN_URL = re.compile(r"job_[0-9a-f]{24}")  # in a callback URL, or a violation line
# The simulator's defaults for the `input` controls (app/simulator/controls.py).
SIM_DEFAULT_OUTPUTS = 1
SIM_DEFAULT_OUTPUT_BYTES = 1024
SIM_DEFAULT_COST = 1
# Only the native protocol reports a cost; Replicate, fal and KIE (as the
# simulator speaks them) report none, so those jobs are charged their
# reservation.
PROVIDERS_REPORTING_COST = ("sim",)


class Check(NamedTuple):
    name: str
    checked: int
    violations: list[str]
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations


def simulator_task_id(provider_task_id: str) -> str:
    """The simulator's own id of a task, as a provider's task id names it:
    Gemini's is an operation name (`models/<model>/operations/<id>`)."""
    return provider_task_id.rsplit("/", 1)[-1]


def controls_of(provider: str, input_: Mapping[str, Any]) -> Mapping[str, Any]:
    """The simulator's controls in a job's input, where its provider's
    protocol carries them: Gemini's in `parameters`, the rest at the top."""
    if provider == "gemini":
        parameters = input_.get("parameters")
        return parameters if isinstance(parameters, dict) else {}
    return input_


def is_sync(provider: str, model: str) -> bool:
    """A job of one sync call (CONTRACT.md: Providers): no task, its answer
    is output 0."""
    return provider_kind(provider, model) is ProviderKind.SYNC


# The sync providers whose answer is JSON the adapter assembled (the final
# Message / ChatCompletion), stored as application/json; the other sync
# models' answers (speech, sound) are the simulator's audio bytes, keyed by
# the call's request id.
LLM_PROVIDERS = (ProviderName.ANTHROPIC, ProviderName.OPENAI)
LLM_CONTENT_TYPE = "application/json"


def _input(value: Any) -> dict:
    if isinstance(value, str):  # a connection without the JSON codec
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


# --- jobs ------------------------------------------------------------------------

SETTLED = """
select j.id, j.status, j.provider_task_id, j.provider_call_started_at, j.finished_at,
       j.credits_reserved, j.credits_charged, j.credits_refunded,
       (select count(*) from ledger l where l.job_id = j.id and l.kind = 'reserve') as reserves,
       (select coalesce(sum(amount), 0) from ledger l where l.job_id = j.id and l.kind = 'reserve') as reserved
from jobs j where j.status = any($1::text[])
"""


async def jobs_settled(conn) -> Check:
    """Every job is terminal, or `uncertain` with its identity (no task id
    invented, the submit on record) and its reservation intact."""
    total = await conn.fetchval("select count(*) from jobs")
    violations, uncertain = [], 0
    for r in await conn.fetch(SETTLED, IN_FLIGHT):
        if r["status"] != JobStatus.UNCERTAIN:
            violations.append(f"{r['id']}: still {r['status']}")
            continue
        uncertain += 1
        problems = []
        if r["provider_task_id"] is not None:
            problems.append("has a task id")
        if r["provider_call_started_at"] is None:
            problems.append("no submit on record")
        if r["finished_at"] is not None:
            problems.append("has finished_at")
        if r["credits_charged"] or r["credits_refunded"]:
            problems.append(f"moved money (charged {r['credits_charged']}, refunded {r['credits_refunded']})")
        if r["reserves"] != 1 or r["reserved"] != r["credits_reserved"]:
            problems.append(f"reservation {r['credits_reserved']} but ledger holds {r['reserved']}")
        if problems:
            violations.append(f"{r['id']}: uncertain but " + ", ".join(problems))
    return Check("every job terminal or uncertain (intact)", total, violations,
                 f"{uncertain} uncertain")


JOB_MONEY = """
select j.id, j.status, j.provider, j.input, j.credits_reserved as r, j.credits_charged as c,
       j.credits_refunded as f,
       count(l.id) filter (where l.kind = 'reserve') as n_reserve,
       coalesce(sum(l.amount) filter (where l.kind = 'reserve'), 0) as l_reserve,
       coalesce(sum(l.amount) filter (where l.kind = 'charge'), 0) as l_charge,
       coalesce(sum(l.amount) filter (where l.kind = 'refund'), 0) as l_refund
from jobs j left join ledger l on l.job_id = j.id
group by j.id
"""


def expected_charge(provider: str, input: Mapping[str, Any], reserved: int, price: Price | None = None,
                    measures: pricing.Measures | None = None) -> int:
    """What a succeeded job must be charged (CONTRACT.md). With a price: the
    price on the measures (app.pricing, fed what the provider did: see
    `provider_measures`), capped at the reservation. Without one: the
    reported cost capped at the reservation, or the reservation when no cost
    is reported."""
    if price is not None:
        return pricing.charge(price, reserved, measures or pricing.Measures(0)).credits
    if provider not in PROVIDERS_REPORTING_COST:
        return reserved
    return states.charge_for(reserved, int(input.get("cost", SIM_DEFAULT_COST)))


# --- what a succeeded job used, measured again --------------------------------------

def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def recorded_usage(value: Any) -> tuple[Usage, ...]:
    """`jobs.usage` (a JSON array of {unit, amount}) as Usage; entries of an
    unknown unit are left out."""
    units = {u.value: u for u in UsageUnit}
    found = []
    for item in _json(value) or ():
        if isinstance(item, Mapping) and item.get("unit") in units and isinstance(item.get("amount"), int | float):
            found.append(Usage(units[item["unit"]], float(item["amount"])))
    return tuple(found)


def llm_controls(provider: str, input_: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator's controls of an LLM call (its `metadata`; OpenAI's
    metadata holds strings, which the simulator reads as JSON numbers)."""
    metadata = input_.get("metadata")
    if not isinstance(metadata, Mapping):
        return {}
    if provider != ProviderName.OPENAI:
        return dict(metadata)
    found = {}
    for key, value in metadata.items():
        try:
            found[key] = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            found[key] = value
    return found


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_sent_text(provider: str, model: str) -> bool:
    """ElevenLabs' sync calls (speech, sound effects): measured by the
    characters of the text sent."""
    return provider == ProviderName.ELEVENLABS and (model.startswith(ELEVENLABS_SPEECH_PREFIX)
                                                     or model == ELEVENLABS_SOUND_MODEL)


def provider_usage(provider: str, model: str, input_: Mapping[str, Any],
                   recorded: tuple[Usage, ...]) -> tuple[Usage, ...]:
    """The usage the provider reported, as the simulator was told to report
    it: an LLM call's tokens when its metadata set both counts, speech's
    and sound effects' characters (the text's length). Otherwise what
    was recorded (the simulator's own estimate, not recomputed here)."""
    if provider in LLM_PROVIDERS:
        controls = llm_controls(provider, input_)
        given, made = controls.get("input_tokens"), controls.get("output_tokens")
        if isinstance(given, int) and isinstance(made, int) and _whole(given) and _whole(made):
            return (Usage(UsageUnit.INPUT_TOKENS, float(given)), Usage(UsageUnit.OUTPUT_TOKENS, float(made)))
    elif is_sent_text(provider, model) and isinstance(input_.get("text"), str):
        return (Usage(UsageUnit.CHARACTERS, float(len(input_["text"]))),)
    return recorded


def provider_measures(provider: str, model: str, input_: Mapping[str, Any], *, outputs: int,
                      seconds: float | None, recorded: tuple[Usage, ...] = ()) -> pricing.Measures:
    """What a succeeded job used at its provider (pure): its outputs stored,
    the seconds its stored media plays (read back from storage), the usage
    the provider reported (`provider_usage`), the cost it reported (the
    native protocol's `cost` control; the others report none)."""
    cost = None
    if provider in PROVIDERS_REPORTING_COST:
        cost = int(controls_of(provider, input_).get("cost", SIM_DEFAULT_COST))
    return pricing.Measures(outputs, seconds=seconds, usage=provider_usage(provider, model, input_, recorded),
                            provider_cost=cost)


def _total(usage: Sequence[Usage], units: tuple[UsageUnit, ...]) -> float | None:
    found = [u.amount for u in usage if u.unit in units]
    return sum(found) if found else None


def measure_problems(provider: str, model: str, input_: Mapping[str, Any], per: str, measures: pricing.Measures,
                     recorded: tuple[Usage, ...], media_outputs: int) -> list[str]:
    """Where what the service recorded or stored is not what the provider
    made (pure): usage that is not what the provider reported, media that
    does not play as long as the provider made it (`output_duration_s` of
    each of `media_outputs` audio/video outputs)."""
    problems = []
    units = {"1k_tokens": pricing.TOKEN_UNITS, "1k_characters": (UsageUnit.CHARACTERS,)}.get(per)
    if units is not None:
        reported, kept = _total(measures.usage, units), _total(recorded, units)
        if reported != kept:
            problems.append(f"usage recorded {kept} {per[3:]}, the provider reported {reported}")
    if per == "second":
        each = controls_of(provider, input_).get("output_duration_s")
        if isinstance(each, int | float) and media_outputs:
            made = media_outputs * float(each)
            if measures.seconds is None or abs(measures.seconds - made) > 0.01 * media_outputs:
                problems.append(f"its stored media plays {measures.seconds} s, the provider made "
                                f"{media_outputs} x {each} s")
    return problems


def _decimal(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return Decimal(repr(value))


def price_record_problems(applied: Mapping[str, Any] | None, price: Price | None, reserved: int, charged: int,
                          measure: Decimal | None) -> list[str]:
    """How a succeeded job's `price_applied` disagrees with its charge
    (pure). `price`: its models-file price; `measure`: the amount of its
    unit it used, measured again (None: it cannot be read). The record
    names that price and reservation, its `charged` is the job's charge,
    equal to min(ceil(credits x its measure), reserved), and its measure is
    the one measured again (none: charged the reservation). A job with no
    price may have no record (closed before records were kept)."""
    if price is None:
        if applied is None:
            return []
        problems = []
        if applied.get("price") is not None:
            problems.append(f"price_applied names a price {applied.get('price')} but its model has none")
        if applied.get("charged") != charged:
            problems.append(f"price_applied says charged {applied.get('charged')}, the job {charged}")
        return problems
    if applied is None:
        return ["priced, but no price_applied recorded"]
    problems = []
    named_price = applied.get("price")
    named: Mapping[str, Any] = named_price if isinstance(named_price, Mapping) else {}
    if _decimal(named.get("credits")) != price.credits or named.get("per") != price.per:
        problems.append(f"price_applied names {applied.get('price')}, the models file "
                        f"{{credits {price.credits}, per {price.per}}}")
    if applied.get("reserved") != reserved:
        problems.append(f"price_applied says reserved {applied.get('reserved')}, the job {reserved}")
    if applied.get("charged") != charged:
        problems.append(f"price_applied says charged {applied.get('charged')}, the job {charged}")
    recorded = applied.get("measure")
    if recorded is None:
        if measure is not None:
            problems.append(f"price_applied could not read the measure, but it is {measure} ({price.per})")
        if charged != reserved:
            problems.append(f"measure unreadable, charged {charged} instead of the reservation {reserved}")
        return problems
    amount = _decimal(recorded)
    if amount is None:
        return [*problems, f"price_applied's measure {recorded!r} is not a number"]
    if measure is None or abs(amount - measure) > Decimal("1e-9"):
        problems.append(f"price_applied's measure is {recorded} ({price.per}), measured again {measure}")
    by_record = min(int((price.credits * amount).to_integral_value(rounding=ROUND_CEILING)), reserved)
    if charged != by_record:
        problems.append(f"charged {charged}, but ceil({price.credits} x {recorded}) capped at {reserved} "
                        f"is {by_record}")
    return problems


@dataclass(frozen=True)
class Charged:
    """A succeeded job's charge beside what it must be: its price (None:
    none applies), what it used (`provider_measures`), its `price_applied`
    record and where what was stored or recorded is not what the provider
    made."""

    job_id: str
    provider: str
    model: str
    input: Mapping[str, Any]
    reserved: int
    charged: int
    price: Price | None
    measures: pricing.Measures
    applied: Mapping[str, Any] | None
    measure_problems: tuple[str, ...] = ()

    @property
    def expected(self) -> int:
        return expected_charge(self.provider, self.input, self.reserved, self.price, self.measures)

    @property
    def measure(self) -> Decimal | None:
        return None if self.price is None else pricing.measure(self.price.per, self.measures, self.reserved)


SUCCEEDED_CHARGES = """
select j.id, j.provider, j.model, j.input, j.usage, j.price_applied, j.credits_reserved, j.credits_charged,
       coalesce(json_agg(json_build_object('key', a.storage_key, 'type', a.content_type) order by a.index)
                filter (where a.job_id is not null), '[]'::json)::text as assets
from jobs j left join assets a on a.job_id = j.id
where j.status = 'succeeded'
group by j.id
"""


async def stored_seconds(storage: Storage, assets: Sequence[Mapping[str, Any]]) -> float | None:
    """The summed duration of the audio/video among a job's stored outputs,
    read back from storage (as a client downloads them) into files that
    app.media measures: 0 when there is none, None when one cannot be read."""
    wanted = [a for a in assets if media.is_media(a["type"])]
    if not wanted:
        return 0.0
    with tempfile.TemporaryDirectory(prefix="longcall-measure-") as directory:
        pairs = []
        for i, a in enumerate(wanted):
            path = os.path.join(directory, str(i))
            try:
                chunks = await storage.open_stream(a["key"])
                f = await asyncio.to_thread(open, path, "wb")
                try:
                    async for chunk in chunks:
                        await asyncio.to_thread(f.write, chunk)
                finally:
                    f.close()
            except (ObjectNotFound, StorageError):
                return None  # outputs_stored names the missing object
            pairs.append((path, a["type"]))
        return await asyncio.to_thread(media.summed_duration_s, pairs)


async def succeeded_charges(conn, models: ModelsFile = NO_MODELS, storage: Storage | None = None,
                            parallel: int = 16) -> dict[str, Charged]:
    """Every succeeded job's charge beside what it must be (`Charged`), its
    price the models file's first matching entry's. A per-second price's
    seconds are read from the stored files, so `storage` is needed then."""
    gate = asyncio.Semaphore(parallel)

    async def one(r) -> Charged:
        input_ = _input(r["input"])
        assets = json.loads(r["assets"])
        entry = models.match(r["provider"], r["model"])
        price = entry.price if entry is not None else None
        recorded = recorded_usage(r["usage"])
        seconds = None
        if price is not None and price.per == "second":
            if storage is None:
                raise ValueError("a per-second price is measured from the stored files: pass the storage")
            async with gate:
                seconds = await stored_seconds(storage, assets)
        measures = provider_measures(r["provider"], r["model"], input_, outputs=len(assets), seconds=seconds,
                                     recorded=recorded)
        problems = () if price is None else tuple(measure_problems(
            r["provider"], r["model"], input_, price.per, measures, recorded,
            sum(1 for a in assets if media.is_media(a["type"]))))
        return Charged(r["id"], r["provider"], r["model"], input_, r["credits_reserved"], r["credits_charged"],
                       price, measures, _json(r["price_applied"]), problems)

    found = await asyncio.gather(*(one(r) for r in await conn.fetch(SUCCEEDED_CHARGES)))
    return {c.job_id: c for c in found}


async def job_money(conn, charges: Mapping[str, Charged] | None = None) -> Check:
    """Per job: reserved = charged + refunded once terminal, nothing moved
    while in flight, the ledger agrees with the job's columns, and a
    succeeded job is charged what it must be (`expected_charge`: its price
    on what it used, or what the provider reported, capped). `charges`:
    from `succeeded_charges` (None: measured here, with no models file)."""
    if charges is None:
        charges = await succeeded_charges(conn)
    rows = await conn.fetch(JOB_MONEY)
    violations = []
    by: Counter = Counter()
    for r in rows:
        problems = []
        if r["n_reserve"] != 1 or r["l_reserve"] != r["r"]:
            problems.append(f"{r['n_reserve']} reserve entries for {r['l_reserve']}, reserved {r['r']}")
        if r["status"] in TERMINAL:
            if r["c"] + r["f"] != r["r"]:
                problems.append(f"charged {r['c']} + refunded {r['f']} != reserved {r['r']}")
        elif r["c"] or r["f"]:
            problems.append(f"in flight with charged {r['c']}, refunded {r['f']}")
        if r["l_charge"] != r["c"] or r["l_refund"] != r["f"]:
            problems.append(f"ledger charge {r['l_charge']}/refund {r['l_refund']} but job says {r['c']}/{r['f']}")
        if r["status"] in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED) and r["c"]:
            problems.append(f"{r['status']} but charged {r['c']}")
        if r["status"] == JobStatus.SUCCEEDED:
            charged = charges.get(r["id"])
            if charged is None:
                want = expected_charge(r["provider"], _input(r["input"]), r["r"])
                price = None
            else:
                want, price = charged.expected, charged.price
            by["by its price" if price else "by the provider's cost or the reservation"] += 1
            if r["c"] != want:
                says = (f"its price ({price.credits} per {price.per}) on what it used says" if price
                        else "the provider's cost says")
                problems.append(f"charged {r['c']}, {says} {want}")
        if problems:
            violations.append(f"{r['id']} ({r['status']}): " + "; ".join(problems))
    return Check("per job: reserved = charged + refunded", len(rows), violations,
                 ", ".join(f"{n} succeeded charged {how}" for how, n in sorted(by.items())))


def prices_applied(charges: Mapping[str, Charged]) -> Check:
    """Every succeeded job's `price_applied` agrees with its charge and its
    price (`price_record_problems`), and what a priced job was charged on is
    what its provider made (`measure_problems`)."""
    violations = []
    units: Counter = Counter()
    unreadable = capped = 0
    for c in sorted(charges.values(), key=lambda c: c.job_id):
        problems = [*price_record_problems(c.applied, c.price, c.reserved, c.charged, c.measure),
                    *c.measure_problems]
        if c.price is not None:
            units[c.price.per] += 1
            measure = c.measure
            if measure is None:
                unreadable += 1
            elif (c.price.credits * measure).to_integral_value(rounding=ROUND_CEILING) > c.reserved:
                capped += 1
        if problems:
            violations.append(f"{c.job_id} ({c.provider} {c.model}): " + "; ".join(problems))
    note = ", ".join(f"{n} per {unit}" for unit, n in sorted(units.items()))
    if units:
        note += f"; {capped} capped at the reservation, {unreadable} unreadable (charged the reservation)"
    return Check("each charge its price on what was measured", len(charges), violations, note or "no prices")


async def charged_or_refunded_once(conn) -> Check:
    """No job has two charge (or two refund, or two reserve) entries."""
    checked = await conn.fetchval("select count(*) from ledger where job_id is not null")
    rows = await conn.fetch("""
        select job_id, kind, count(*) as n from ledger where job_id is not null
        group by job_id, kind having count(*) > 1""")
    return Check("no job charged or refunded twice", checked,
                 [f"{r['job_id']}: {r['n']} {r['kind']} entries" for r in rows])


OWNER_MONEY = """
select o.id, o.granted, o.balance, o.reserved, o.charged,
  (select coalesce(sum(amount), 0) from ledger l where l.owner_id = o.id and l.kind = 'grant') as grants,
  (select count(*) from ledger l where l.owner_id = o.id and l.kind = 'grant' and l.amount < 0) as clawbacks,
  (select coalesce(sum(amount), 0) from ledger l where l.owner_id = o.id and l.kind = 'reserve') as reserves,
  (select coalesce(sum(amount), 0) from ledger l where l.owner_id = o.id and l.kind = 'refund') as refunds,
  (select coalesce(sum(credits_reserved), 0) from jobs j
    where j.owner_id = o.id and j.status = any($1::text[])) as in_flight_reserved,
  (select coalesce(sum(credits_charged), 0) from jobs j where j.owner_id = o.id) as jobs_charged
from owners o
"""


async def owner_money(conn) -> Check:
    """Per owner: granted = balance + in-flight reserved + charged, with each
    term recomputed from the jobs and the balance replayed from the ledger;
    granted is the sum of the owner's grant rows, a platform's claw-backs
    (negative grants) included, and no balance or counter is below zero."""
    rows = await conn.fetch(OWNER_MONEY, IN_FLIGHT)
    violations = []
    for o in rows:
        problems = []
        if o["granted"] != o["grants"]:
            problems.append(f"granted {o['granted']} but grants sum to {o['grants']}")
        negative = [name for name in ("granted", "balance", "reserved", "charged") if o[name] < 0]
        if negative:
            problems.append(f"{', '.join(negative)} below zero")
        if o["granted"] != o["balance"] + o["in_flight_reserved"] + o["jobs_charged"]:
            problems.append(f"granted {o['granted']} != balance {o['balance']} + in-flight reserved "
                            f"{o['in_flight_reserved']} + charged {o['jobs_charged']}")
        if o["reserved"] != o["in_flight_reserved"]:
            problems.append(f"reserved counter {o['reserved']} != in-flight jobs' {o['in_flight_reserved']}")
        if o["charged"] != o["jobs_charged"]:
            problems.append(f"charged counter {o['charged']} != jobs' {o['jobs_charged']}")
        replayed = o["grants"] - o["reserves"] + o["refunds"]
        if o["balance"] != replayed:
            problems.append(f"balance {o['balance']} != ledger replay {replayed}")
        if problems:
            violations.append(f"{o['id']}: " + "; ".join(problems))
    clawbacks = sum(o["clawbacks"] for o in rows)
    return Check("per owner: granted = balance + reserved + charged", len(rows), violations,
                 f"{clawbacks} claw-back(s) among the grants" if clawbacks else "")


async def active_slots(conn) -> Check:
    """Per owner: the active-slot counter equals the jobs in flight."""
    rows = await conn.fetch("""
        select o.id, o.active,
          (select count(*) from jobs j where j.owner_id = o.id and j.status = any($1::text[])) as in_flight
        from owners o""", IN_FLIGHT)
    return Check("active slots = jobs in flight, per owner", len(rows),
                 [f"{r['id']}: active {r['active']}, in flight {r['in_flight']}"
                  for r in rows if r["active"] != r["in_flight"]])


async def closed_jobs_hold_no_secret(conn) -> Check:
    checked = await conn.fetchval("select count(*) from jobs where status = any($1::text[])", TERMINAL)
    rows = await conn.fetch("select id, status from jobs where status = any($1::text[]) "
                            "and webhook_secret is not null", TERMINAL)
    return Check("no closed job holds a webhook secret", checked,
                 [f"{r['id']} ({r['status']}): webhook secret still stored" for r in rows])


async def no_intent_for_terminal_job(conn, *, cancel_grace_s: float = 120.0) -> Check:
    """Closing a job deletes its submit and settle intents. A provider
    cancel may outlive it for a while (a few backed-off attempts, a lease):
    one still there `cancel_grace_s` after the job closed is stuck. A
    notification of the close is sent after it: its intent stays while its
    delivery is pending (notifications_kept holds that to its 24 h)."""
    checked = await conn.fetchval("select count(*) from jobs where status = any($1::text[])", TERMINAL)
    rows = await conn.fetch("""
        select o.job_id, o.kind, j.status, o.attempts, o.not_before, o.claimed_until,
               j.finished_at < now() - make_interval(secs => $2) as overdue, d.status as delivery
        from outbox o join jobs j on j.id = o.job_id left join deliveries d on d.id = o.delivery_id
        where j.status = any($1::text[])
        order by o.job_id""", TERMINAL, float(cancel_grace_s))
    violations, draining, delivering = [], 0, 0
    for r in rows:
        if r["kind"] == IntentKind.CANCEL and not r["overdue"]:
            draining += 1
            continue
        if r["kind"] == IntentKind.NOTIFY and r["delivery"] == DeliveryStatus.PENDING:
            delivering += 1
            continue
        violations.append(f"{r['job_id']} ({r['status']}): {r['kind']} intent left (attempts {r['attempts']}, "
                          f"due {r['not_before']:%H:%M:%S}, claimed until {r['claimed_until']})")
    notes = [f"{draining} provider cancel(s) still draining"] if draining else []
    notes += [f"{delivering} notification(s) still being delivered"] if delivering else []
    return Check("no intent left for a terminal job", checked, violations, "; ".join(notes))


# --- the provider ------------------------------------------------------------------

# Providers whose tasks carry no reference to their job (no callback URL, no
# name): Gemini's operations. They are counted, not attributed: at most one
# per job of theirs whose submit started.
UNATTRIBUTABLE = ("gemini",)


async def one_provider_task_per_job(conn, sim_stats: Mapping[str, Any],
                                    tasks_by_job: Mapping[str, int] | None = None) -> Check:
    """At most one provider task per job, counted by the simulator per job id
    (every protocol's callback URL carries our job id; `tasks_by_job` adds
    tasks attributed otherwise: ElevenLabs dubs by their name). A job with a
    saved task id and a registered callback has exactly one; a job whose
    submit never started has none; a sync job (one call, no task) has none
    and no task id; no task belongs to a job that does not exist; tasks
    nothing attributes are no more than the UNATTRIBUTABLE providers' jobs
    whose submit started."""
    by_job: Counter = Counter(tasks_by_job or {})
    violations = []
    for url, n in (sim_stats.get("creates_by_callback_url") or {}).items():
        found = set(JOB_ID_IN_URL.findall(url))
        if len(found) != 1:
            violations.append(f"{n} task(s) with a callback URL naming no single job")
            continue
        by_job[found.pop()] += n
    unattributed = sim_stats.get("tasks_created", 0) - sum((sim_stats.get("creates_by_callback_url") or {}).values())
    unattributed -= sum((tasks_by_job or {}).values())
    may_be_unattributed = await conn.fetchval(
        "select count(*) from jobs where provider = any($1::text[]) and provider_call_started_at is not null",
        list(UNATTRIBUTABLE))
    if unattributed > may_be_unattributed or unattributed < 0:
        violations.append(f"{unattributed} task(s) nothing attributes to a job, but only {may_be_unattributed} "
                          f"submit(s) of {', '.join(UNATTRIBUTABLE)} jobs started")
    for key, n in (sim_stats.get("creates_by_idempotency_key") or {}).items():
        if n > 1:
            violations.append(f"idempotency key {key}: {n} tasks")
    rows = await conn.fetch("select id, provider, model, status, provider_task_id, callback_registered, "
                            "provider_call_started_at from jobs")
    known = set()
    for r in rows:
        known.add(r["id"])
        n = by_job.get(r["id"], 0)
        if is_sync(r["provider"], r["model"]):  # one call, never a task (no_sync_call_twice counts calls)
            if n or r["provider_task_id"] is not None:
                violations.append(f"{r['id']} ({r['status']}): a sync job with a provider task "
                                  f"({n} counted, task id {r['provider_task_id']!r})")
            continue
        if n > 1:
            violations.append(f"{r['id']} ({r['status']}): {n} provider tasks")
        elif n == 0 and r["provider_task_id"] is not None and r["callback_registered"]:
            violations.append(f"{r['id']} ({r['status']}): task id saved but the provider created none")
        elif n and r["provider_call_started_at"] is None:
            violations.append(f"{r['id']} ({r['status']}): a provider task but no submit on record")
    for job_id in sorted(set(by_job) - known):
        violations.append(f"{job_id}: {by_job[job_id]} provider task(s) for a job that does not exist")
    return Check("one provider task per job", len(rows), violations,
                 f"{sum(by_job.values())} tasks for {len(by_job)} jobs, {unattributed} counted only "
                 f"({'/'.join(UNATTRIBUTABLE)}: at most {may_be_unattributed})")


SYNC_JOBS = """
select id, provider, model, status, provider_call_started_at is not null as called
from jobs where provider = any($1::text[])
"""


async def no_sync_call_twice(conn, sim_stats: Mapping[str, Any]) -> Check:
    """A sync call is made once per job, never again blindly (CONTRACT.md:
    Sync calls). The simulator counts each sync call that did its work by
    the sha256 of its raw body (`sync_calls_by_body`), and every job's body
    is its own (its input is): a body counted twice is one job's call made
    twice. The calls are no more than the sync jobs whose call started
    (`provider_call_started_at`: saved before the call), and no fewer than
    the sync jobs that succeeded (an answer no call gave is invented; one
    recovered from a provider's record was counted when it was made)."""
    by_body: Mapping[str, int] = sim_stats.get("sync_calls_by_body") or {}
    violations = [f"one body (sha256 {digest[:12]}…) called {n} times" for digest, n in sorted(by_body.items())
                  if n > 1]
    calls = sum(by_body.values())
    rows = [r for r in await conn.fetch(SYNC_JOBS, [ProviderName.ANTHROPIC, ProviderName.OPENAI,
                                                    ProviderName.ELEVENLABS])
            if is_sync(r["provider"], r["model"])]
    called = sum(1 for r in rows if r["called"])
    succeeded = [r for r in rows if r["status"] == JobStatus.SUCCEEDED]
    if calls > called:
        violations.append(f"{calls} sync calls made, but only {called} sync job(s) started a call")
    for r in succeeded:
        if not r["called"]:
            violations.append(f"{r['id']} (succeeded): a sync job with no call on record")
    if len(succeeded) > calls:
        violations.append(f"{len(succeeded)} sync jobs succeeded, but the provider did only {calls} call(s)")
    return Check("no sync call made twice for one job", len(rows), violations,
                 f"{calls} calls for {called} sync jobs that started one ({len(succeeded)} succeeded)")


# --- capacity ------------------------------------------------------------------------

# Each provider's protocol prefix at the simulator, as its `peak_concurrent` names it.
SIM_PREFIXES: dict[str, str] = {m.PROTOCOL: m.PREFIX for m in (
    sim_native, sim_replicate, sim_fal, sim_kie, sim_gateway, sim_gemini, sim_elevenlabs, sim_anthropic,
    sim_openai)}


@dataclass(frozen=True)
class Cap:
    """A cap of a run: MAX_IN_FLIGHT_<PROVIDER> (`entry` None) or a
    models-file entry's `max_in_flight` (`entry`: its model glob), which
    counts the jobs whose first matching entry it is."""

    provider: str
    limit: int
    entry: str | None = None

    @property
    def name(self) -> str:
        if self.entry is None:
            return f"MAX_IN_FLIGHT_{self.provider.upper()}={self.limit}"
        return f"{self.provider} {self.entry} max_in_flight={self.limit}"

    def covers(self, models: ModelsFile, provider: str, model: str) -> bool:
        if provider != self.provider:
            return False
        if self.entry is None:
            return True
        entry = models.match(provider, model)
        return entry is not None and entry.model == self.entry


def caps_of(models: ModelsFile, env: Mapping[str, str]) -> list[Cap]:
    """The caps a service started with this models file and environment holds."""
    caps = [Cap(p.value, int(env[f"MAX_IN_FLIGHT_{p.value.upper()}"])) for p in ProviderName
            if env.get(f"MAX_IN_FLIGHT_{p.value.upper()}")]
    caps += [Cap(e.provider, e.max_in_flight, e.model) for e in models.entries if e.max_in_flight is not None]
    return caps


# One sample of the jobs a cap counts ($1: the capped providers): how many
# of each model are submitted and not closed, and how many wait queued.
CAP_SAMPLE = f"""
select provider, model, status, count(*) as n from jobs
where provider = any($1::text[]) and status in {tuple(s.value for s in (JobStatus.QUEUED, *SUBMITTED))}
group by 1, 2, 3
"""


@dataclass
class CapTally:
    """What samples of the database saw of one cap: the most jobs under it
    submitted at once, and in how many samples it was full with a job of
    it waiting (it bound)."""

    cap: Cap
    samples: int = 0
    peak: int = 0
    peak_at_s: float | None = None
    bound: int = 0

    def add(self, models: ModelsFile, rows: Iterable[Mapping[str, Any]], at_s: float) -> None:
        """One sample: `rows` of (provider, model, status, n), as CAP_SAMPLE reads them."""
        submitted = waiting = 0
        for r in rows:
            if not self.cap.covers(models, r["provider"], r["model"]):
                continue
            if r["status"] in SUBMITTED:
                submitted += r["n"]
            elif r["status"] == JobStatus.QUEUED:
                waiting += r["n"]
        self.samples += 1
        if submitted > self.peak:
            self.peak, self.peak_at_s = submitted, at_s
        if submitted >= self.cap.limit and waiting:
            self.bound += 1


def caps_in_database(tallies: Sequence[CapTally]) -> Check:
    """No cap ever had more jobs under it submitted and not closed than its
    limit, in any sample of the database taken while the run went on."""
    violations = [f"{t.cap.name}: {t.peak} jobs submitted at once (at {t.peak_at_s:.1f} s)"
                  for t in tallies if t.peak > t.cap.limit]
    note = "; ".join(f"{t.cap.name} peak {t.peak}, full with jobs waiting in {t.bound} of {t.samples} samples"
                     for t in tallies)
    return Check("no cap exceeded in the database (sampled)", sum(t.samples for t in tallies), violations,
                 note or "no caps")


async def caps_at_provider(conn, sim_stats: Mapping[str, Any], caps: Sequence[Cap], models: ModelsFile) -> Check:
    """No provider ever had more in flight than a cap, by its own count
    (the simulator's `peak_concurrent` per protocol prefix: tasks from
    their creation to their end, sync calls while they run). A cap speaks
    for a prefix when every job of its provider falls under it: always
    MAX_IN_FLIGHT_<PROVIDER>, an entry's cap only when each of the
    provider's models in the run first matches that entry (others are
    held to the database samples alone)."""
    peaks: Mapping[str, int] = sim_stats.get("peak_concurrent") or {}
    violations, notes, checked = [], [], 0
    for cap in caps:
        prefix = SIM_PREFIXES.get(cap.provider)
        models_run = [r["model"] for r in await conn.fetch("select distinct model from jobs where provider = $1",
                                                           cap.provider)]
        if prefix is None or not all(cap.covers(models, cap.provider, m) for m in models_run):
            notes.append(f"{cap.name}: not all of {prefix}")
            continue
        checked += 1
        peak = int(peaks.get(prefix, 0))
        notes.append(f"{prefix} peak {peak} ({cap.name})")
        if peak > cap.limit:
            violations.append(f"{prefix}: {peak} tasks and calls in flight at once at the provider, "
                              f"over {cap.name}")
    return Check("no provider had more in flight than its cap (simulator)", checked, violations,
                 "; ".join(notes) or "no caps")


# --- storage -------------------------------------------------------------------------

SUCCEEDED_OUTPUTS = """
select j.id, j.owner_id, j.status, j.provider, j.model, j.provider_task_id, j.provider_operation, j.input,
       coalesce(json_agg(json_build_object('index', a.index, 'key', a.storage_key, 'bytes', a.bytes,
                                           'sha256', a.sha256, 'type', a.content_type) order by a.index)
                filter (where a.job_id is not null), '[]'::json)::text as assets
from jobs j left join assets a on a.job_id = j.id
where j.status = 'succeeded' or a.job_id is not null
group by j.id
"""


async def _measure(storage: Storage, key: str) -> tuple[int, str] | None:
    """Size and sha256 of the stored bytes, recomputed by reading them."""
    try:
        chunks = await storage.open_stream(key)
    except ObjectNotFound:
        return None
    digest, size = hashlib.sha256(), 0
    async for chunk in chunks:
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


async def outputs_stored(conn, storage: Storage, *, simulator_bytes: bool = True,
                         parallel: int = 16) -> Check:
    """Every succeeded job has all its outputs in storage under the
    deterministic key, with the recorded size and sha256 (recomputed from
    the stored bytes, read back as a client's download reads them); no other job
    has assets. A sync job has one, its answer (output 0; an LLM's is
    `application/json`). With `simulator_bytes`, the bytes are also the ones the
    simulator produced for that task (its outputs are a pure function of
    task id, index and size) or, for speech and sound effects, for that call
    (keyed by the request id kept in the job's `provider_operation`); an LLM
    answer is the adapter's JSON, held only to what was recorded."""
    rows = await conn.fetch(SUCCEEDED_OUTPUTS)
    violations: list[str] = []
    objects: list[tuple[str, dict, int | None, str | None]] = []
    for r in rows:
        assets = json.loads(r["assets"])
        if r["status"] != JobStatus.SUCCEEDED:
            violations.append(f"{r['id']} ({r['status']}): has {len(assets)} asset(s)")
            continue
        input_ = controls_of(r["provider"], _input(r["input"]))
        sync = is_sync(r["provider"], r["model"])
        want = 1 if sync else int(input_.get("outputs", SIM_DEFAULT_OUTPUTS))  # a sync answer is output 0
        if [a["index"] for a in assets] != list(range(want)):
            violations.append(f"{r['id']}: assets {[a['index'] for a in assets]}, the provider made {want}")
        size: int | None = int(input_.get("output_bytes", SIM_DEFAULT_OUTPUT_BYTES)) if simulator_bytes else None
        if sync:
            # An LLM answer is JSON the adapter assembled (no simulator bytes);
            # speech and sound are the simulator's bytes keyed by the call's
            # request id (a WAV of `output_duration_s` is sized otherwise).
            source = _input(r["provider_operation"]).get("request_id")
            if r["provider"] in LLM_PROVIDERS or "output_duration_s" in input_:
                size = None
            elif size is not None and not isinstance(source, str):
                violations.append(f"{r['id']}: a sync answer with no request id recorded ({source!r})")
                size = None
        else:
            source = simulator_task_id(r["provider_task_id"])
            if "output_duration_s" in input_:
                size = None  # a real WAV/MP4, sized by its duration (app.simulator.media_sha256)
        for a in assets:
            if a["key"] != object_key(r["owner_id"], r["id"], a["index"]):
                violations.append(f"{r['id']}[{a['index']}]: stored under {a['key']!r}, not its own key")
            if sync and r["provider"] in LLM_PROVIDERS and a["type"] != LLM_CONTENT_TYPE:
                violations.append(f"{r['id']}[{a['index']}]: an LLM answer stored as {a['type']!r}, "
                                  f"not {LLM_CONTENT_TYPE}")
            expected = output_sha256(source, a["index"], size) if size is not None else None
            objects.append((r["id"], a, size, expected))

    gate = asyncio.Semaphore(parallel)

    async def check_one(job_id: str, a: dict, size: int | None, expected_sha: str | None) -> list[str]:
        async with gate:
            try:
                measured = await _measure(storage, a["key"])
            except StorageError as e:
                return [f"{job_id}[{a['index']}]: storage error {e}"]
        where = f"{job_id}[{a['index']}]"
        if measured is None:
            return [f"{where}: object missing"]
        problems = []
        if measured != (a["bytes"], a["sha256"]):
            problems.append(f"{where}: stored {measured[0]} bytes sha256 {measured[1][:12]}, "
                            f"recorded {a['bytes']} bytes sha256 {a['sha256'][:12]}")
        if size is not None and (a["bytes"], a["sha256"]) != (size, expected_sha):
            problems.append(f"{where}: not the provider's bytes ({a['bytes']} bytes, expected {size})")
        return problems

    for found in await asyncio.gather(*(check_one(*o) for o in objects)):
        violations.extend(found)
    return Check("succeeded outputs stored with their sha256 and size", len(objects), violations,
                 f"{sum(1 for r in rows if r['status'] == JobStatus.SUCCEEDED)} succeeded jobs")


# --- what a client was told ------------------------------------------------------------

async def accepted_creates_are_jobs(conn, accepted: Mapping[str, str], refused: Iterable[str]) -> Check:
    """Every create a client saw accepted (202/200, by its Idempotency-Key)
    is exactly one job with that id; every refused one (402/429) made none;
    and no job exists that no client was told about."""
    rows = await conn.fetch("select id, request_key from jobs")
    by_key = {r["request_key"]: r["id"] for r in rows if r["request_key"] is not None}
    violations = []
    for key, job_id in accepted.items():
        got = by_key.get(key)
        if got != job_id:
            violations.append(f"key {key}: the client was given {job_id}, the database has {got}")
    refused = set(refused)
    for key in sorted(refused & set(by_key)):
        violations.append(f"key {key}: refused, yet job {by_key[key]} exists")
    told = set(accepted.values())
    for r in rows:
        if r["id"] not in told and r["request_key"] not in refused:
            violations.append(f"{r['id']}: a job no client was told about (key {r['request_key']})")
    return Check("every accepted create is one job, and only those", len(accepted) + len(refused),
                 violations)


async def client_cancels_held(conn, cancelled: Iterable[str]) -> Check:
    """A cancel answered 200 made the job cancelled for good, fully refunded."""
    ids = sorted(set(cancelled))
    rows = await conn.fetch("select id, status, credits_refunded, credits_reserved from jobs "
                            "where id = any($1::text[])", ids)
    found = {r["id"]: r for r in rows}
    violations = []
    for job_id in ids:
        r = found.get(job_id)
        if r is None:
            violations.append(f"{job_id}: cancelled, then gone")
        elif r["status"] != JobStatus.CANCELLED or r["credits_refunded"] != r["credits_reserved"]:
            violations.append(f"{job_id}: cancelled (200), now {r['status']} with "
                              f"{r['credits_refunded']} of {r['credits_reserved']} refunded")
    return Check("a cancel answered 200 stays cancelled and refunded", len(ids), violations)


async def reads_agree(conn, seen_terminal: Mapping[str, str]) -> Check:
    """A terminal status a client read is the job's final status."""
    rows = await conn.fetch("select id, status from jobs where id = any($1::text[])", list(seen_terminal))
    final = {r["id"]: r["status"] for r in rows}
    return Check("terminal statuses clients read are final", len(seen_terminal),
                 [f"{job_id}: a client read {status}, the job is {final.get(job_id)}"
                  for job_id, status in sorted(seen_terminal.items()) if final.get(job_id) != status])


# --- a platform's owners, as its client was told (CONTRACT.md: Apps with many users) ---------

class OwnerMade(NamedTuple):
    """An owner a platform's client created (`POST /v1/owners`), as it was told."""

    owner_id: str
    request_key: str  # the create's Idempotency-Key
    credits: int  # the create's opening credits


class GrantSent(NamedTuple):
    """A grant a platform's client sent (`POST /v1/owners/{id}/grants`) and
    what its answers came to: `moved` (201, or 200 to a retry after an
    answer was lost), `refused` (402) or `unanswered`."""

    owner_id: str
    request_key: str
    credits: int  # negative: a claw-back
    reason: str | None
    outcome: str


class GrantRow(NamedTuple):
    """A grant row of the ledger, of an owner under the platform."""

    owner_id: str
    amount: int
    reason: str | None
    request_key: str | None


GRANT_MOVED, GRANT_REFUSED, GRANT_UNANSWERED = "moved", "refused", "unanswered"


def grant_problems(made: Iterable[OwnerMade], sent: Iterable[GrantSent], rows: Iterable[GrantRow]) -> list[str]:
    """Where a platform's owners' grant rows are not what its client was
    told (pure): each owner has its opening credits as one keyless row (none
    for 0) and no other keyless row; each grant answered as moved is exactly
    one row under its key with its amount and reason (so no retry or replay
    moved it twice); a refused one has none; no row has a key the client
    never sent for that owner. With `owner_money` (granted = the sum of the
    rows) this holds each owner's granted to what the answers said."""
    by_key: dict[tuple[str, str | None], list[GrantRow]] = {}
    for r in rows:
        by_key.setdefault((r.owner_id, r.request_key), []).append(r)
    violations = []
    owners = set()
    for m in made:
        owners.add(m.owner_id)
        opening = [r.amount for r in by_key.pop((m.owner_id, None), [])]
        want = [m.credits] if m.credits else []
        if opening != want:
            violations.append(f"{m.owner_id}: opening grant rows {opening}, its create asked for {want}")
    for g in sent:
        found = by_key.pop((g.owner_id, g.request_key), [])
        where = f"{g.owner_id} grant {g.request_key} ({g.credits:+d}, {g.outcome})"
        if g.outcome == GRANT_MOVED:
            if len(found) != 1:
                violations.append(f"{where}: {len(found)} ledger rows, one expected")
            elif (found[0].amount, found[0].reason) != (g.credits, g.reason):
                violations.append(f"{where}: the row says {found[0].amount:+d} for {found[0].reason!r}, "
                                  f"the client asked {g.reason!r}")
        elif g.outcome == GRANT_REFUSED:
            if found:
                violations.append(f"{where}: refused, yet {len(found)} ledger row(s)")
        elif len(found) > 1:
            violations.append(f"{where}: {len(found)} ledger rows")
    for (owner_id, key), found in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        what = "keyless grant row(s)" if key is None else f"grant row(s) under key {key}"
        whose = "" if owner_id in owners else ", an owner the client never made"
        violations.append(f"{owner_id}: {len(found)} {what} no client sent{whose}")
    return violations


PLATFORM_GRANTS = """
select l.owner_id, l.amount, l.reason, l.request_key from ledger l join owners o on o.id = l.owner_id
where l.kind = 'grant' and o.platform_id = $1
"""


async def grants_kept(conn, platform_id: str, made: Iterable[OwnerMade], sent: Iterable[GrantSent]) -> Check:
    """`grant_problems` over the ledger's grant rows of the platform's owners."""
    made, sent = list(made), list(sent)
    rows = [GrantRow(r["owner_id"], r["amount"], r["reason"], r["request_key"])
            for r in await conn.fetch(PLATFORM_GRANTS, platform_id)]
    outcomes = Counter(("claw-back" if g.credits < 0 else "grant", g.outcome) for g in sent)
    note = (f"{outcomes['grant', GRANT_MOVED]} grants and {outcomes['claw-back', GRANT_MOVED]} claw-backs moved, "
            f"{outcomes['grant', GRANT_REFUSED] + outcomes['claw-back', GRANT_REFUSED]} refused; {len(rows)} "
            f"ledger rows")
    return Check("each grant the platform was answered moved once, as answered", len(rows) + len(sent),
                 grant_problems(made, sent, rows), note)


class OwnerRow(NamedTuple):
    id: str
    is_platform: bool
    platform_id: str | None
    request_key: str | None


def platform_owner_problems(platform_id: str, made: Iterable[OwnerMade], owners: Iterable[OwnerRow],
                            job_owners: Mapping[str, str], expected_owners: Mapping[str, str]) -> list[str]:
    """Where the owners and their jobs are not what a platform's client
    made and asked for (pure): the platform is one, its owners are exactly
    the ones its client was told it made (one per create key: no replay made
    another), each under its create's key and none a platform itself; every
    owner with a platform is under a platform owner; and each job
    (`job_owners`: job idempotency key -> owner) belongs to the owner the
    load made it for (`expected_owners`, by the same key)."""
    made = {m.owner_id: m for m in made}
    rows = {o.id: o for o in owners}
    violations = []
    platform = rows.get(platform_id)
    if platform is None or not platform.is_platform or platform.platform_id is not None:
        violations.append(f"{platform_id}: not a platform owner ({platform})")
    for o in rows.values():
        if o.is_platform and o.platform_id is not None:
            violations.append(f"{o.id}: a platform under platform {o.platform_id}")
        parent = rows.get(o.platform_id) if o.platform_id is not None else None
        if o.platform_id is not None and (parent is None or not parent.is_platform):
            violations.append(f"{o.id}: under {o.platform_id}, which is no platform")
    under = {o.id for o in rows.values() if o.platform_id == platform_id}
    for owner_id in sorted(under - set(made)):
        violations.append(f"{owner_id}: an owner under the platform that its client was never told of "
                          f"(key {rows[owner_id].request_key})")
    for owner_id, m in sorted(made.items()):
        o = rows.get(owner_id)
        if o is None or o.platform_id != platform_id:
            violations.append(f"{owner_id}: made by the platform's create {m.request_key}, but "
                              f"{'gone' if o is None else f'under {o.platform_id}'}")
        elif o.request_key != m.request_key:
            violations.append(f"{owner_id}: made under key {m.request_key}, the row says {o.request_key}")
    for key, owner_id in sorted(job_owners.items()):
        want = expected_owners.get(key)
        if want is not None and owner_id != want:
            violations.append(f"job key {key}: its job belongs to {owner_id}, the client made it for {want}")
    return violations


async def platform_owners_kept(conn, platform_id: str, made: Iterable[OwnerMade],
                               expected_owners: Mapping[str, str]) -> Check:
    """`platform_owner_problems` over the owners and jobs tables."""
    owners = [OwnerRow(r["id"], r["is_platform"], r["platform_id"], r["request_key"])
              for r in await conn.fetch("select id, is_platform, platform_id, request_key from owners")]
    job_owners = {r["request_key"]: r["owner_id"]
                  for r in await conn.fetch("select request_key, owner_id from jobs where request_key is not null")}
    under = {o.id for o in owners if o.platform_id == platform_id}
    theirs = sum(1 for owner_id in job_owners.values() if owner_id in under)
    return Check("a platform's owners are the ones it made, each job its owner's", len(owners) + len(job_owners),
                 platform_owner_problems(platform_id, made, owners, job_owners, expected_owners),
                 f"{len(under)} owners under the platform, {theirs} jobs of theirs")


def secrets_not_logged(log_paths: Iterable[str], secrets: Mapping[str, str]) -> Check:
    """No log line of any process carries a secret (SECRET_KEY, an API key,
    a provider token). Searched by each secret's last 16 characters: an API
    key's first characters are its public prefix and may be logged."""
    needles = {name: value[-16:] for name, value in secrets.items() if len(value) >= 32}
    violations, lines = [], 0
    for path in log_paths:
        with open(path, errors="replace") as f:
            for number, line in enumerate(f, 1):
                lines += 1
                for name, needle in needles.items():
                    if needle in line:
                        violations.append(f"{os.path.basename(path)}:{number} shows {name}")
    return Check("no secret in any log line", lines, violations)


# --- notifications to the client ----------------------------------------------------------

# CONTRACT.md: Notifications to the client. One notification per notified
# transition (running, uncertain, each close), written with it, with one
# delivery per endpoint of the owner, or of the owner's platform (Apps with
# many users), that asked for the event; each delivery
# is delivered, still retrying within its 24 h, or failed because its
# endpoint was deleted. Timestamps are the writing transactions' now().
# Its last attempt is due at the 24 h mark and may run a little late, then
# wait for its answer, before failed is recorded.
RETRY_FOR = dt.timedelta(hours=24)
LAST_ATTEMPT_FOR = dt.timedelta(seconds=LAST_ATTEMPT_LATE_S + SEND_TIMEOUT_S)
NOTIFY_CHECK = "each notified transition notified once, to each endpoint"


class Endpoint(NamedTuple):
    id: str
    owner_id: str
    events: tuple[str, ...]
    created_at: dt.datetime
    deleted_at: dt.datetime | None


class NotifiedJob(NamedTuple):
    id: str
    owner_id: str
    status: str
    created_at: dt.datetime
    finished_at: dt.datetime | None
    ran: int  # task_saved lines with job_was_closed false: the times it became running
    platform_id: str | None = None  # its owner's platform, whose endpoints are asked too


class Notification(NamedTuple):
    id: str
    owner_id: str
    job_id: str
    type: str
    created_at: dt.datetime
    data_id: str | None  # the job in its `data`, and its status there
    data_status: str | None
    platform_id: str | None = None  # its job's owner's platform (it lists the notification)


class Delivery(NamedTuple):
    notification_id: str
    endpoint_id: str
    status: str
    attempts: int
    last_status_code: int | None
    retry_from: dt.datetime
    has_intent: bool  # a `notify` intent names it (a pending one without is never sent)


class Receipt(NamedTuple):
    """One request a receiver of the run got, as it saw it."""

    endpoint_id: str | None  # None: a path no endpoint of the run uses
    webhook_id: str | None
    type: str | None  # from the body
    job_id: str | None  # the body's data.id
    signature_ok: bool  # verified with `standardwebhooks` under the endpoint's secret
    answered: int  # the status code the receiver answered


@dataclass
class NotifyTally:
    notifications: int = 0
    deliveries: int = 0
    delivered: int = 0
    pending: int = 0
    failed: int = 0
    received: int = 0
    duplicates: int = 0  # 2xx answers beyond the first for one notification at one endpoint
    bad_signatures: int = 0
    to_platforms: int = 0  # of the deliveries: to an endpoint of the job owner's platform

    def line(self) -> str:
        text = (f"{self.notifications} notifications written, {self.deliveries} deliveries: {self.delivered} "
                f"delivered, {self.pending} still pending, {self.failed} failed")
        if self.to_platforms:
            text += f"; {self.to_platforms} of the deliveries to a platform's endpoints"
        if self.received:
            text += (f"; receivers got {self.received} requests, {self.duplicates} duplicates, "
                     f"{self.bad_signatures} bad signatures")
        return text


def _asks(endpoint: Endpoint, job: NotifiedJob, type_: str) -> bool:
    """The endpoint is the job owner's, or its owner's platform's, and asks for the event."""
    return endpoint.owner_id in (job.owner_id, job.platform_id) and type_ in endpoint.events


def _may_match(endpoint: Endpoint, job: NotifiedJob, type_: str, now: dt.datetime) -> bool:
    """The endpoint may have been there for one of the job's transitions:
    created before the job's end, not deleted before it began."""
    end = job.finished_at or now
    return (_asks(endpoint, job, type_) and endpoint.created_at <= end
            and (endpoint.deleted_at is None or endpoint.deleted_at > job.created_at))


def _must_match(endpoint: Endpoint, job: NotifiedJob, type_: str, now: dt.datetime) -> bool:
    """The endpoint was there for all of the job's life, so for each of its transitions."""
    end = job.finished_at or now
    return (_asks(endpoint, job, type_) and endpoint.created_at <= job.created_at
            and (endpoint.deleted_at is None or endpoint.deleted_at >= end))


def _transitions(job: NotifiedJob) -> dict[str, tuple[int, int]]:
    """How many notifications of each type the job's history calls for,
    (at least, at most), were every endpoint asking: one for its close, one
    per time it became running, one if it is uncertain now (at most one if
    it was once: no line records it)."""
    wanted = {t.value: (0, 0) for t in NotificationType}
    if job.status in TERMINAL:
        wanted[f"job.{job.status}"] = (1, 1)
    wanted[NotificationType.RUNNING] = (job.ran, job.ran)
    wanted[NotificationType.UNCERTAIN] = (1, 1) if job.status == JobStatus.UNCERTAIN else (0, 1)
    return wanted


def _is_2xx(code: int | None) -> bool:
    return code is not None and 200 <= code < 300


def notification_problems(jobs: Iterable[NotifiedJob], endpoints: Iterable[Endpoint],
                          notifications: Iterable[Notification], deliveries: Iterable[Delivery],
                          receipts: Iterable[Receipt] | None, now: dt.datetime) -> tuple[list[str], NotifyTally]:
    """Every notified transition has exactly one notification, with exactly
    one delivery per endpoint of its owner (or of its owner's platform) that
    asked for its event, each
    delivered or still retrying within its 24 h (failed only when its
    endpoint was deleted). With `receipts` (what the receivers got): every
    delivered notification reached its endpoint's receiver with a valid
    signature, under the notification's id, and answered 2xx; no receiver
    got anything that is not a notification of its endpoint. Pure."""
    jobs_by_id = {j.id: j for j in jobs}
    endpoints = list(endpoints)
    endpoints_by_id = {e.id: e for e in endpoints}
    notifications = list(notifications)
    by_id = {n.id: n for n in notifications}
    tally = NotifyTally(notifications=len(notifications))
    violations: list[str] = []

    made: Counter = Counter((n.job_id, n.type) for n in notifications)
    for job in jobs_by_id.values():
        for type_, (least, most) in _transitions(job).items():
            if not any(_may_match(e, job, type_, now) for e in endpoints):
                least = most = 0  # no endpoint asked: nothing is written
            elif not any(_must_match(e, job, type_, now) for e in endpoints):
                least = 0  # an endpoint came or went during the job's life: either way
            got = made[job.id, type_]
            if not least <= got <= most:
                want = str(least) if least == most else f"{least} to {most}"
                violations.append(f"{job.id} ({job.status}): {got} {type_} notification(s), expected {want}")

    sent_to: dict[str, list[str]] = {n.id: [] for n in notifications}
    deliveries = list(deliveries)
    for d in deliveries:
        sent_to.setdefault(d.notification_id, []).append(d.endpoint_id)
    for n in notifications:
        job = jobs_by_id.get(n.job_id)
        if job is None:
            violations.append(f"{n.id}: a notification of {n.job_id}, a job that does not exist")
            continue
        if n.owner_id != job.owner_id or n.data_id != job.id or f"job.{n.data_status}" != n.type:
            violations.append(f"{n.id} ({n.type} of {job.id}): its owner {n.owner_id} and data "
                              f"({n.data_id}, {n.data_status}) are not its job's")
        if n.platform_id != job.platform_id:
            violations.append(f"{n.id} ({n.type} of {job.id}): its platform {n.platform_id}, its job's owner's "
                              f"{job.platform_id}")
        got = Counter(sent_to[n.id])
        if not got:
            violations.append(f"{n.id} ({n.type} of {job.id}): written with no delivery")
        for endpoint_id, k in sorted(got.items()):
            e = endpoints_by_id.get(endpoint_id)
            if k > 1:
                violations.append(f"{n.id} ({n.type} of {job.id}): {k} deliveries to {endpoint_id}")
            if e is None or not _may_match(e, job, n.type, now):
                violations.append(f"{n.id} ({n.type} of {job.id}): a delivery to {endpoint_id}, which did not "
                                  f"ask for it")
        for e in endpoints:
            if _must_match(e, job, n.type, now) and e.id not in got:
                violations.append(f"{n.id} ({n.type} of {job.id}): no delivery to {e.id}, which asked for it")

    for d in deliveries:
        where = f"{d.notification_id} to {d.endpoint_id}"
        if d.notification_id not in by_id:
            violations.append(f"{where}: a delivery of no notification")
        endpoint = endpoints_by_id.get(d.endpoint_id)
        tally.deliveries += 1
        notified = jobs_by_id.get(by_id[d.notification_id].job_id) if d.notification_id in by_id else None
        if endpoint is not None and notified is not None and endpoint.owner_id == notified.platform_id:
            tally.to_platforms += 1
        if d.status == DeliveryStatus.DELIVERED:
            tally.delivered += 1
            if d.attempts < 1 or not _is_2xx(d.last_status_code):
                violations.append(f"{where}: delivered after {d.attempts} attempts, last answer "
                                  f"{d.last_status_code}")
        elif d.status == DeliveryStatus.PENDING:
            tally.pending += 1
            if d.retry_from + RETRY_FOR + LAST_ATTEMPT_FOR < now:
                violations.append(f"{where}: still pending {now - d.retry_from} after its retries began")
            if not d.has_intent:
                violations.append(f"{where}: pending with no notify intent (it is never sent)")
        else:
            tally.failed += 1
            if endpoint is None or endpoint.deleted_at is None:
                violations.append(f"{where}: {d.status} after {d.attempts} attempts, its endpoint still there")

    if receipts is not None:
        violations += _receipt_problems(list(receipts), by_id, deliveries, tally)
    return violations, tally


def _receipt_problems(receipts: list[Receipt], notifications: Mapping[str, Notification],
                      deliveries: Sequence[Delivery], tally: NotifyTally) -> list[str]:
    """What the receivers got, held to the deliveries (see notification_problems)."""
    violations = []
    ours = {(d.endpoint_id, d.notification_id) for d in deliveries}
    accepted: Counter = Counter()  # (endpoint, notification) -> valid requests answered 2xx
    tally.received = len(receipts)
    for r in receipts:
        where = f"{r.endpoint_id or 'an unknown path'} got {r.webhook_id}"
        if not r.signature_ok:
            tally.bad_signatures += 1
            violations.append(f"{where}: a bad signature")
        if r.endpoint_id is None or (r.endpoint_id, r.webhook_id) not in ours:
            violations.append(f"{where}: not a notification of that endpoint")
            continue
        n = notifications.get(r.webhook_id)
        if n is None:
            continue  # a delivery of no notification: named above
        if (r.type, r.job_id) != (n.type, n.job_id):
            violations.append(f"{where}: the body says {r.type} of {r.job_id}, the notification is "
                              f"{n.type} of {n.job_id}")
        elif r.signature_ok and _is_2xx(r.answered):
            accepted[r.endpoint_id, r.webhook_id] += 1
    tally.duplicates = sum(k - 1 for k in accepted.values())
    for d in deliveries:
        if d.status == DeliveryStatus.DELIVERED and not accepted[d.endpoint_id, d.notification_id]:
            violations.append(f"{d.notification_id} to {d.endpoint_id}: delivered, but its receiver never "
                              f"accepted it with a valid signature")
    return violations


NOTIFIED_JOBS = f"""
select j.id, j.owner_id, j.status, j.created_at, j.finished_at, o.platform_id,
       (select count(*) from job_events e where e.job_id = j.id and e.type = '{EventType.TASK_SAVED}'
          and e.detail->>'job_was_closed' = 'false') as ran
from jobs j join owners o on o.id = j.owner_id
"""
ENDPOINTS = "select id, owner_id, events, created_at, deleted_at from webhook_endpoints"
NOTIFICATIONS = """
select id, owner_id, job_id, type, created_at, data->>'id' as data_id, data->>'status' as data_status,
       platform_id
from notifications
"""
DELIVERIES = f"""
select d.notification_id, d.endpoint_id, d.status, d.attempts, d.last_status_code, d.retry_from,
       d.id in (select o.delivery_id from outbox o where o.kind = '{IntentKind.NOTIFY}') as has_intent
from deliveries d
"""


async def notifications_kept(conn, receipts: Iterable[Receipt] | None = None) -> tuple[Check, NotifyTally]:
    """`notification_problems` over the database's rows (and, given them,
    what the receivers got), read in one snapshot; the check's note is the
    tally's line. Not among `system_checks`: like the client's checks, it
    wants what the run recorded (the receipts)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _notifications_kept(conn, receipts)


async def _notifications_kept(conn, receipts: Iterable[Receipt] | None) -> tuple[Check, NotifyTally]:
    jobs = [NotifiedJob(r["id"], r["owner_id"], r["status"], r["created_at"], r["finished_at"], r["ran"],
                        r["platform_id"]) for r in await conn.fetch(NOTIFIED_JOBS)]
    endpoints = [Endpoint(r["id"], r["owner_id"], tuple(r["events"]), r["created_at"], r["deleted_at"])
                 for r in await conn.fetch(ENDPOINTS)]
    notifications = [Notification(r["id"], r["owner_id"], r["job_id"], r["type"], r["created_at"], r["data_id"],
                                  r["data_status"], r["platform_id"]) for r in await conn.fetch(NOTIFICATIONS)]
    deliveries = [Delivery(r["notification_id"], r["endpoint_id"], r["status"], r["attempts"],
                           r["last_status_code"], r["retry_from"], r["has_intent"])
                  for r in await conn.fetch(DELIVERIES)]
    now = await conn.fetchval("select now()")
    violations, tally = notification_problems(jobs, endpoints, notifications, deliveries, receipts, now)
    return Check(NOTIFY_CHECK, len(jobs) + tally.notifications, violations, tally.line()), tally


# --- the timeline tells each job's story -------------------------------------------------------

TIMELINE_CHECK = "each job's timeline tells its story"
# After its close a job's timeline may still say: a status call that was out
# when it closed, a task saved on the closed job (then cancelled), and its
# notifications' deliveries.
AFTER_CLOSE = {"status_checked", "task_saved", "notification_delivered", "notification_failed"}


class StoryJob(NamedTuple):
    id: str
    status: str
    provider: str
    model: str
    credits_reserved: int
    credits_charged: int
    credits_refunded: int
    error_code: str | None
    provider_task_id: str | None
    submit_attempts: int
    assets: tuple[tuple[int, int, str], ...]  # (index, bytes, sha256) of each stored output
    delivered: int  # its notifications' deliveries by status
    failed: int


class Line(NamedTuple):
    type: str
    detail: Mapping[str, Any]


def timeline_problems(job: StoryJob, lines: Sequence[Line]) -> list[str]:
    """What is wrong with one job's timeline (its lines in order) as the
    story of that job, read against the job's own row (pure): created first
    and once, with what was asked; a submit_sent per claim; the task saved
    once, naming the job's task; a call_started only for a sync job; each
    stored output and the close (its money, its status) exactly once and in
    that order; nothing after the close but what may follow it; one line
    per ended delivery."""
    problems: list[str] = []
    types = [line.type for line in lines]
    count = Counter(types)

    def bad(what: str) -> None:
        problems.append(f"{job.id} ({job.status}): {what}")

    if not lines or types[0] != "created" or count["created"] != 1:
        bad(f"the timeline does not start with one `created` line: {types[:3]}")
    else:
        created = lines[0].detail
        if (created.get("provider"), created.get("model"), created.get("max_credits")) != \
                (job.provider, job.model, job.credits_reserved):
            bad(f"`created` says {dict(created)}, the job is {job.provider}/{job.model} for {job.credits_reserved}")
    if count["submit_sent"] != job.submit_attempts:
        bad(f"{count['submit_sent']} submit_sent lines for {job.submit_attempts} submit claims")
    saved = [line for line in lines if line.type == "task_saved"]
    if job.provider_task_id is None and saved:
        bad("a task_saved line on a job with no task")
    if job.provider_task_id is not None and [line.detail.get("task_id") for line in saved] != [job.provider_task_id]:
        bad(f"task_saved lines {[line.detail.get('task_id') for line in saved]}, the job's task is "
            f"{job.provider_task_id}")
    if count["call_started"] and not is_sync(job.provider, job.model):
        bad("call_started on an async job")
    stored = sorted((line.detail.get("index"), line.detail.get("bytes"), line.detail.get("sha256"))
                    for line in lines if line.type == "output_stored")
    if stored != sorted(job.assets):
        bad(f"output_stored lines {stored} are not its outputs {sorted(job.assets)}")
    closes = [i for i, t in enumerate(types) if t == "closed"]
    if job.status in TERMINAL:
        if len(closes) != 1:
            bad(f"{len(closes)} closed lines")
        else:
            at = closes[0]
            closed = lines[at].detail
            said = (closed.get("status"), closed.get("charged"), closed.get("refunded"), closed.get("error_code"))
            actual = (job.status, job.credits_charged, job.credits_refunded, job.error_code)
            if said != actual:
                bad(f"`closed` says {said}, the job is {actual}")
            if any(t == "output_stored" for t in types[at + 1:]):
                bad("an output stored after the close")
            late = [t for t in types[at + 1:] if t not in AFTER_CLOSE]
            if late:
                bad(f"after the close: {late}")
    elif closes:
        bad("a closed line on a job still in flight")
    if (count["notification_delivered"], count["notification_failed"]) != (job.delivered, job.failed):
        bad(f"{count['notification_delivered']} delivered and {count['notification_failed']} failed lines for "
            f"{job.delivered} delivered and {job.failed} failed deliveries")
    return problems


STORY_JOBS = """
select j.id, j.status, j.provider, j.model, j.credits_reserved, j.credits_charged, j.credits_refunded,
       j.error_code, j.provider_task_id, j.submit_attempts,
       coalesce((select array_agg(array[a.index::text, a.bytes::text, a.sha256] order by a.index)
                 from assets a where a.job_id = j.id), '{}') as assets,
       (select count(*) from deliveries d join notifications n on n.id = d.notification_id
        where n.job_id = j.id and d.status = 'delivered') as delivered,
       (select count(*) from deliveries d join notifications n on n.id = d.notification_id
        where n.job_id = j.id and d.status = 'failed') as failed
from jobs j order by j.id
"""
STORY_LINES = "select job_id, type, detail from job_events order by job_id, id"


async def timelines_tell_the_story(conn) -> Check:
    lines: dict[str, list[Line]] = {}
    for r in await conn.fetch(STORY_LINES):
        detail = r["detail"] if isinstance(r["detail"], Mapping) else json.loads(r["detail"])
        lines.setdefault(r["job_id"], []).append(Line(r["type"], detail))
    problems: list[str] = []
    rows = await conn.fetch(STORY_JOBS)
    for r in rows:
        assets = tuple((int(i), int(b), sha) for i, b, sha in (r["assets"] or []))
        job = StoryJob(r["id"], r["status"], r["provider"], r["model"], r["credits_reserved"], r["credits_charged"],
                       r["credits_refunded"], r["error_code"], r["provider_task_id"], r["submit_attempts"], assets,
                       r["delivered"], r["failed"])
        problems += timeline_problems(job, lines.get(job.id, []))
    # No foreign key holds a line to its job (migrations/011): this does.
    known = {r["id"] for r in rows}
    problems += [f"{job_id}: {len(kept)} timeline lines and no such job"
                 for job_id, kept in sorted(lines.items()) if job_id not in known]
    return Check(TIMELINE_CHECK, len(rows), problems)


# --- all of them -----------------------------------------------------------------------------

async def system_checks(conn, *, sim_stats: Mapping[str, Any], storage: Storage,
                        simulator_bytes: bool = True, tasks_by_job: Mapping[str, int] | None = None,
                        models: ModelsFile = NO_MODELS, caps: Sequence[Cap] = ()) -> list[Check]:
    """Every invariant DESIGN.md states that can be read off a quiet system,
    all from one snapshot of the database. `models`: the models file the
    service ran with (its prices); `caps`: the caps it held (with them, the
    simulator's peaks are held to them)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _system_checks(conn, sim_stats, storage, simulator_bytes, tasks_by_job, models, caps)


async def _system_checks(conn, sim_stats, storage, simulator_bytes, tasks_by_job=None, models=NO_MODELS,
                         caps=()) -> list[Check]:
    charges = await succeeded_charges(conn, models, storage)
    checks = [
        await jobs_settled(conn),
        await job_money(conn, charges),
        prices_applied(charges),
        await charged_or_refunded_once(conn),
        await owner_money(conn),
        await one_provider_task_per_job(conn, sim_stats, tasks_by_job),
        await no_sync_call_twice(conn, sim_stats),
        await outputs_stored(conn, storage, simulator_bytes=simulator_bytes),
        await active_slots(conn),
        await closed_jobs_hold_no_secret(conn),
        await no_intent_for_terminal_job(conn),
        await timelines_tell_the_story(conn),
    ]
    if caps:
        checks.append(await caps_at_provider(conn, sim_stats, caps, models))
    return checks


def format_table(checks: Iterable[Check], *, examples: int = 5) -> str:
    checks = list(checks)
    width = max([len("invariant")] + [len(c.name) for c in checks])
    lines = [f"{'invariant':<{width}}  {'checked':>8}  {'violations':>10}  note",
             f"{'-' * width}  {'-' * 8}  {'-' * 10}  {'-' * 4}"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.checked:>8}  {len(c.violations):>10}  {c.note}")
    for c in checks:
        if c.violations:
            lines.append(f"\n{c.name}: {len(c.violations)} violation(s)")
            lines.extend(f"  {v}" for v in c.violations[:examples])
            if len(c.violations) > examples:
                lines.append(f"  ... and {len(c.violations) - examples} more")
    return "\n".join(lines)


async def job_history(conn, job_id: str) -> str:
    """A job's row, ledger, assets and intents, for a violation report
    (never its secret)."""
    job = await conn.fetchrow("""
        select id, owner_id, provider, model, status, provider_task_id, callback_registered,
               provider_call_started_at, submit_in_doubt, submit_attempts,
               last_error, credits_reserved, credits_charged, credits_refunded, error_code,
               error_message, created_at, updated_at, finished_at, deadline_at,
               webhook_secret is not null as holds_secret, input::text as input
        from jobs where id = $1""", job_id)
    if job is None:
        return f"{job_id}: no such job"
    lines = [f"job {job_id}:"]
    lines.extend(f"  {k} = {v}" for k, v in dict(job).items())
    for r in await conn.fetch("select kind, amount, created_at from ledger where job_id = $1 order by id", job_id):
        lines.append(f"  ledger {r['kind']} {r['amount']} at {r['created_at']}")
    for r in await conn.fetch("select index, storage_key, bytes, sha256 from assets where job_id = $1 "
                              "order by index", job_id):
        lines.append(f"  asset {r['index']} {r['storage_key']} {r['bytes']} bytes {r['sha256'][:12]}")
    for r in await conn.fetch("select kind, not_before, claimed_until, generation, attempts from outbox "
                              "where job_id = $1", job_id):
        lines.append(f"  intent {r['kind']} due {r['not_before']} claimed until {r['claimed_until']} "
                     f"generation {r['generation']} attempts {r['attempts']}")
    return "\n".join(lines)
