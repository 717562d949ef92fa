"""The `max_concurrent` fault and the `peak_concurrent` stat, under every
protocol prefix: a create or a sync call that would make more than n of its
prefix in flight is that protocol's 429 (the throttle's answer) and does
nothing; the stat is the most of each prefix in flight at once.

Timing: a task or call meant to be in flight lasts at least 1 s while the
requests that rely on it take milliseconds; one meant to be over is waited
for (its status read until terminal, its answer read to the end)."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.simulator.faults import MAX_CONCURRENT, FaultError, parse_faults
from app.simulator.state import InFlight

from .helpers import wait_until

BEARER = {"Authorization": "Bearer t"}
FAL_KEY = {"Authorization": "Key k"}
GOOG = {"x-goog-api-key": "k"}
XI = {"xi-api-key": "xi"}
GATEWAY = {**BEARER, "ai-gateway-protocol-version": "0.0.1", "ai-gateway-auth-method": "api-key",
           "ai-video-model-specification-version": "4", "ai-model-id": "klingai/kling-v3.0-t2v"}
ANTHROPIC = {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01"}
LONG = {"duration_s": 30}
SHORT = {"duration_s": 1.0}


def faults(client: httpx.Client, **values: Any) -> None:
    client.post("/_sim/faults", json=values).raise_for_status()


def stats(client: httpx.Client) -> dict[str, Any]:
    return client.get("/_sim/stats").json()


def without_ids(value: Any) -> Any:
    """An answer with its per-request ids left out: what two answers of the
    same kind share."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k != "request_id"}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def assert_same_answer(response: httpx.Response, throttled: httpx.Response) -> None:
    assert throttled.status_code == 429, throttled.text
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == throttled.headers["retry-after"] == "1"
    assert response.headers["content-type"] == throttled.headers["content-type"]
    assert without_ids(response.json()) == without_ids(throttled.json())


def dub_form(controls: dict[str, Any]) -> list[tuple[str, tuple[None, str]]]:
    fields = {"source_url": "https://media.example.com/a.mp4", "target_lang": "es", **controls}
    return [(k, (None, str(v))) for k, v in fields.items()]


# ------------------------------------------------------------------ the async protocols


@dataclass(frozen=True)
class Protocol:
    create: Callable[[httpx.Client, dict[str, Any]], httpx.Response]
    ended: Callable[[httpx.Client, httpx.Response], bool]  # the task the create made has ended
    cancel: Callable[[httpx.Client, httpx.Response], httpx.Response] | None = None

    def made(self, response: httpx.Response) -> bool:
        if response.status_code not in (200, 201):
            return False
        body = response.json()
        return body.get("code", 200) == 200  # KIE says in the body


def _kie_state(client: httpx.Client, made: httpx.Response) -> str:
    data = client.get("/kie/api/v1/jobs/recordInfo", params={"taskId": made.json()["data"]["taskId"]},
                      headers=BEARER).json()["data"]
    return data["state"]


ASYNC = {
    "/v1": Protocol(
        create=lambda c, i: c.post("/v1/tasks", json={"model": "m", "input": i}),
        ended=lambda c, r: c.get(f"/v1/tasks/{r.json()['id']}").json()["status"] in ("succeeded", "failed"),
        cancel=lambda c, r: c.post(f"/v1/tasks/{r.json()['id']}/cancel"),
    ),
    "/replicate": Protocol(
        create=lambda c, i: c.post("/replicate/v1/predictions", json={"version": "a/b:1", "input": i},
                                   headers=BEARER),
        ended=lambda c, r: c.get(r.json()["urls"]["get"], headers=BEARER).json()["status"] == "succeeded",
        cancel=lambda c, r: c.post(r.json()["urls"]["cancel"], headers=BEARER),
    ),
    "/fal": Protocol(
        create=lambda c, i: c.post("/fal/fal-ai/flux/dev", json=i, headers=FAL_KEY),
        ended=lambda c, r: c.get(r.json()["status_url"], headers=FAL_KEY).json()["status"] == "COMPLETED",
        cancel=lambda c, r: c.put(r.json()["cancel_url"], headers=FAL_KEY),
    ),
    "/kie": Protocol(
        create=lambda c, i: c.post("/kie/api/v1/jobs/createTask", json={"model": "k", "input": i}, headers=BEARER),
        ended=lambda c, r: _kie_state(c, r) == "success",
    ),
    "/gateway": Protocol(
        create=lambda c, i: c.post("/gateway/v4/ai/video-model/start", json={"prompt": "p", **i}, headers=GATEWAY),
        ended=lambda c, r: c.post("/gateway/v4/ai/video-model/status", json={"operation": r.json()["operation"]},
                                  headers=GATEWAY).json()["status"] == "completed",
    ),
    "/gemini": Protocol(
        create=lambda c, i: c.post("/gemini/v1beta/models/veo-3.1-generate-preview:predictLongRunning",
                                   json={"instances": [{"prompt": "p"}], "parameters": i}, headers=GOOG),
        ended=lambda c, r: c.get(f"/gemini/v1beta/{r.json()['name']}", headers=GOOG).json().get("done", False),
    ),
    "/elevenlabs": Protocol(
        create=lambda c, i: c.post("/elevenlabs/v1/dubbing", files=dub_form(i), headers=XI),
        ended=lambda c, r: c.get(f"/elevenlabs/v1/dubbing/{r.json()['dubbing_id']}",
                                 headers=XI).json()["status"] == "dubbed",
    ),
}


def throttled_create(client: httpx.Client, protocol: Protocol) -> httpx.Response:
    faults(client, throttle=1)
    try:
        return protocol.create(client, LONG)
    finally:
        client.delete("/_sim/faults").raise_for_status()


@pytest.mark.parametrize("prefix", sorted(ASYNC))
def test_a_create_above_max_concurrent_is_the_protocols_429_until_a_task_ends(client, prefix):
    protocol = ASYNC[prefix]
    throttled = throttled_create(client, protocol)
    faults(client, max_concurrent=2)
    short, long = protocol.create(client, SHORT), protocol.create(client, LONG)
    assert protocol.made(short) and protocol.made(long), (short.text, long.text)

    refused = protocol.create(client, LONG)
    assert_same_answer(refused, throttled)
    assert stats(client)["tasks_created"] == 2  # the refused create made nothing
    assert stats(client)["peak_concurrent"] == {prefix: 2}

    wait_until(lambda: protocol.ended(client, short), 5, "the short task's end")
    assert protocol.made(protocol.create(client, LONG))  # its place is free
    assert_same_answer(protocol.create(client, LONG), throttled)  # and taken again
    after = stats(client)
    assert after["tasks_created"] == 3 and after["peak_concurrent"] == {prefix: 2}


@pytest.mark.parametrize("prefix", sorted(p for p, protocol in ASYNC.items() if protocol.cancel))
def test_a_cancel_ends_a_task_in_flight(client, prefix):
    protocol = ASYNC[prefix]
    assert protocol.cancel is not None
    faults(client, max_concurrent=1)
    first = protocol.create(client, LONG)
    assert protocol.made(first)
    assert protocol.create(client, LONG).status_code == 429
    assert protocol.cancel(client, first).status_code in (200, 202)
    assert protocol.made(protocol.create(client, LONG))


def test_the_limit_is_per_prefix(client):
    faults(client, max_concurrent=1)
    for prefix in sorted(ASYNC):
        assert ASYNC[prefix].made(ASYNC[prefix].create(client, LONG)), prefix
    assert all(ASYNC[prefix].create(client, LONG).status_code == 429 for prefix in ASYNC)
    assert stats(client)["peak_concurrent"] == {prefix: 1 for prefix in ASYNC}


def test_a_prefixs_routes_share_its_count(client):
    """KIE's Market and its families are one prefix; so are Replicate's
    predictions and trainings."""
    faults(client, max_concurrent=1)
    assert ASYNC["/kie"].made(ASYNC["/kie"].create(client, LONG))
    veo = client.post("/kie/api/v1/veo/generate", json={"prompt": "p", **LONG}, headers=BEARER)
    assert (veo.status_code, veo.json()) == (429, {"code": 429, "msg": "Rate Limited", "data": None})
    assert ASYNC["/replicate"].made(ASYNC["/replicate"].create(client, LONG))
    training = client.post("/replicate/v1/models/a/b/versions/v1/trainings", headers=BEARER,
                           json={"destination": "me/tuned", "input": LONG})
    assert training.status_code == 429 and training.headers["retry-after"] == "1"
    assert stats(client)["tasks_created"] == 2


def test_a_replayed_create_makes_nothing_and_is_never_refused(client):
    faults(client, max_concurrent=1)
    made = client.post("/v1/tasks", json={"model": "m", "input": LONG}, headers={"Idempotency-Key": "k1"})
    again = client.post("/v1/tasks", json={"model": "m", "input": LONG}, headers={"Idempotency-Key": "k1"})
    assert (made.status_code, again.status_code) == (201, 200) and again.json()["id"] == made.json()["id"]
    gateway = {**GATEWAY, "idempotency-key": "g1"}
    start = client.post("/gateway/v4/ai/video-model/start", json={"prompt": "p", **LONG}, headers=gateway)
    replay = client.post("/gateway/v4/ai/video-model/start", json={"prompt": "p", **LONG}, headers=gateway)
    assert (start.status_code, replay.status_code) == (200, 200)
    assert replay.json()["operation"] == start.json()["operation"]
    assert stats(client)["peak_concurrent"] == {"/v1": 1, "/gateway": 1}


def test_a_bad_create_is_still_its_4xx(client):
    """The limit is checked where the work would start: a request that would
    be refused anyway gets its own answer."""
    faults(client, max_concurrent=1)
    assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, LONG))
    assert client.post("/v1/tasks", json={"model": "m", "input": {"duration_s": -1}}).status_code == 400


def test_clearing_the_faults_lifts_the_limit(client):
    faults(client, max_concurrent=1)
    assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, LONG))
    assert ASYNC["/v1"].create(client, LONG).status_code == 429
    assert client.delete("/_sim/faults").json()["max_concurrent"] is None
    assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, LONG))
    faults(client, max_concurrent=3)  # a POST states the whole configuration: 2 in flight, room for 1
    assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, LONG))
    faults(client, drop_webhook=0)  # ... and leaving it out means no limit
    assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, LONG))
    assert stats(client)["peak_concurrent"] == {"/v1": 4}


# ------------------------------------------------------------------ peak_concurrent


def test_peak_concurrent_is_the_most_at_once_not_the_total(client):
    for _ in range(3):  # each ends as it is made
        assert ASYNC["/v1"].made(ASYNC["/v1"].create(client, {"duration_s": 0}))
    assert stats(client)["peak_concurrent"] == {"/v1": 1}
    first, _second = ASYNC["/v1"].create(client, LONG), ASYNC["/v1"].create(client, LONG)
    assert stats(client)["peak_concurrent"] == {"/v1": 2}
    ASYNC["/v1"].cancel(client, first)  # type: ignore[misc]
    ASYNC["/v1"].create(client, LONG)
    assert stats(client)["peak_concurrent"] == {"/v1": 2}
    ASYNC["/v1"].create(client, LONG)
    assert stats(client)["peak_concurrent"] == {"/v1": 3}
    assert stats(client)["tasks_created"] == 7
    client.post("/_sim/reset").raise_for_status()
    assert stats(client)["peak_concurrent"] == {}


# ------------------------------------------------------------------ sync calls


@dataclass(frozen=True)
class SyncRoute:
    prefix: str
    # (client, controls, a word that makes the body unique) -> the answer, read to its end
    call: Callable[[httpx.Client, dict[str, Any], str], httpx.Response]


def _anthropic(stream: bool) -> Callable[[httpx.Client, dict[str, Any], str], httpx.Response]:
    def call(client: httpx.Client, controls: dict[str, Any], word: str) -> httpx.Response:
        body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": stream, "metadata": controls,
                "messages": [{"role": "user", "content": word}]}
        return client.post("/anthropic/v1/messages", json=body, headers=ANTHROPIC)
    return call


def _openai(stream: bool) -> Callable[[httpx.Client, dict[str, Any], str], httpx.Response]:
    def call(client: httpx.Client, controls: dict[str, Any], word: str) -> httpx.Response:
        body = {"model": "gpt-4o-mini", "stream": stream, "metadata": controls,
                "messages": [{"role": "user", "content": word}]}
        return client.post("/openai/v1/chat/completions", json=body, headers=BEARER)
    return call


def _elevenlabs(path: str) -> Callable[[httpx.Client, dict[str, Any], str], httpx.Response]:
    def call(client: httpx.Client, controls: dict[str, Any], word: str) -> httpx.Response:
        return client.post(f"/elevenlabs/v1/{path}", json={"text": word, **controls}, headers=XI)
    return call


SYNC = {
    "anthropic": SyncRoute("/anthropic", _anthropic(stream=False)),
    "anthropic-stream": SyncRoute("/anthropic", _anthropic(stream=True)),
    "openai": SyncRoute("/openai", _openai(stream=False)),
    "openai-stream": SyncRoute("/openai", _openai(stream=True)),
    "elevenlabs-speech": SyncRoute("/elevenlabs", _elevenlabs("text-to-speech/v1")),
    "elevenlabs-speech-stream": SyncRoute("/elevenlabs", _elevenlabs("text-to-speech/v1/stream")),
    "elevenlabs-sound": SyncRoute("/elevenlabs", _elevenlabs("sound-generation")),
}


def _in_thread(sim_url: str, work: Callable[[httpx.Client], httpx.Response]) -> Future[httpx.Response]:
    pool = ThreadPoolExecutor(1)
    client = httpx.Client(base_url=sim_url, timeout=10.0, trust_env=False)

    def run() -> httpx.Response:
        with client:
            return work(client)

    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


def calls_made(client: httpx.Client) -> int:
    return sum(stats(client)["sync_calls_by_body"].values())


@pytest.mark.parametrize("name", sorted(SYNC))
def test_a_sync_call_above_max_concurrent_is_the_429_and_not_counted(client, sim_url, name):
    route = SYNC[name]
    faults(client, throttle=1)
    throttled = route.call(client, {}, "throttled")
    faults(client, max_concurrent=1)
    slow = _in_thread(sim_url, lambda c: route.call(c, {"duration_s": 1.5}, "slow"))
    wait_until(lambda: calls_made(client) == 1, 5, "the slow call's work to start")

    refused = route.call(client, {"duration_s": 0}, "refused")
    assert_same_answer(refused, throttled)
    assert calls_made(client) == 1  # the refused call did nothing
    assert slow.result(timeout=10).status_code == 200  # read to its end: its answer has gone out

    assert calls_made(client) == 1
    assert route.call(client, {"duration_s": 0}, "after").status_code == 200
    assert calls_made(client) == 2
    assert stats(client)["peak_concurrent"] == {route.prefix: 1}


def test_a_dropped_answer_ends_the_call(client, sim_url):
    """`submit_timeout_after_create` holds the answer (HOLD_S here), then drops
    it: the call is in flight until then."""
    route = SYNC["anthropic"]
    faults(client, max_concurrent=1, submit_timeout_after_create=1)

    def dropped(c: httpx.Client) -> httpx.Response:
        with pytest.raises(httpx.RemoteProtocolError):
            route.call(c, {"duration_s": 0}, "dropped")
        return httpx.Response(200)

    held = _in_thread(sim_url, dropped)
    wait_until(lambda: calls_made(client) == 1, 5, "the held call's work")
    faults(client, max_concurrent=1)  # no more drops; the held one is still held
    assert route.call(client, {"duration_s": 0}, "refused").status_code == 429
    held.result(timeout=10)
    assert calls_made(client) == 1
    assert route.call(client, {"duration_s": 0}, "after").status_code == 200


def test_overlapping_sync_calls_and_tasks_of_one_prefix_count_together(client, sim_url):
    dub = ASYNC["/elevenlabs"].create(client, LONG)
    assert ASYNC["/elevenlabs"].made(dub)
    speech = SYNC["elevenlabs-speech"]
    slow = _in_thread(sim_url, lambda c: speech.call(c, {"duration_s": 1.5}, "slow"))
    wait_until(lambda: calls_made(client) == 1, 5, "the slow call's work")
    assert speech.call(client, {"duration_s": 0}, "quick").status_code == 200
    assert stats(client)["peak_concurrent"] == {"/elevenlabs": 3}
    assert slow.result(timeout=10).status_code == 200
    assert speech.call(client, {"duration_s": 0}, "alone").status_code == 200
    assert stats(client)["peak_concurrent"] == {"/elevenlabs": 3}

    faults(client, max_concurrent=1)  # the dub is still in flight
    assert speech.call(client, {"duration_s": 0}, "refused").status_code == 429
    assert SYNC["openai"].call(client, {"duration_s": 0}, "other prefix").status_code == 200


def test_calls_one_after_another_peak_at_one(client):
    for word in ("a", "b", "c"):
        assert SYNC["openai"].call(client, {"duration_s": 0}, word).status_code == 200
    assert stats(client)["peak_concurrent"] == {"/openai": 1}


# ------------------------------------------------------------------ pure parts


def test_in_flight_counts_until_the_end_and_keeps_the_peak():
    peaks: dict[str, int] = {}
    flight = InFlight(peaks)
    flight.add("/a", "t1", 0.0, 10.0)
    flight.add("/a", "t2", 1.0, 5.0)
    assert [flight.count("/a", now) for now in (1.0, 4.999, 5.0, 9.0, 10.0)] == [2, 2, 1, 1, 0]
    flight.add("/a", "t3", 11.0, 11.0)  # ends as it starts: counted in the peak, never in flight
    assert flight.count("/a", 11.0) == 0 and peaks == {"/a": 2}
    flight.add("/a", "t4", 12.0, 100.0)
    flight.end("/a", "t4")  # cancelled
    assert flight.count("/a", 12.0) == 0 and flight.count("/a", 200.0) == 0
    flight.add("/b", "call", 0.0)  # no end: a sync call until it is released
    assert flight.count("/b", math.inf) == 1
    flight.end("/b", "call")
    flight.end("/b", "call")  # twice is once
    flight.end("/c", "never added")
    assert flight.count("/b", 0.0) == 0 and flight.count("/c", 0.0) == 0
    assert peaks == {"/a": 2, "/b": 1}


def test_in_flight_a_cancel_then_the_old_end_passing_changes_nothing():
    flight = InFlight({})
    flight.add("/a", "t1", 0.0, 5.0)
    flight.end("/a", "t1")
    flight.add("/a", "t2", 1.0, 50.0)
    assert flight.count("/a", 6.0) == 1  # t1's stale end leaves t2 alone


@pytest.mark.parametrize(("value", "expected"), [
    (1, 1), (3, 3), (3.0, 3), (MAX_CONCURRENT, MAX_CONCURRENT), (None, None),
])
def test_max_concurrent_values(value, expected):
    assert parse_faults({"max_concurrent": value}).max_concurrent == expected
    assert parse_faults({}).max_concurrent is None


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, MAX_CONCURRENT + 1, [1]])
def test_max_concurrent_refuses_what_is_not_a_count(value):
    with pytest.raises(FaultError, match="max_concurrent"):
        parse_faults({"max_concurrent": value})


@pytest.mark.parametrize("body", [b'{"max_concurrent": 0}', b'{"max_concurrent": 2.5}', b'{"max_concurrent": "1"}'])
def test_a_bad_max_concurrent_is_400_and_changes_nothing(client, body):
    faults(client, max_concurrent=4)
    response = client.post("/_sim/faults", content=body)
    assert response.status_code == 400 and "max_concurrent" in response.json()["error"]
    assert client.get("/_sim/faults").json()["max_concurrent"] == 4


def test_the_faults_show_max_concurrent(client):
    assert client.get("/_sim/faults").json()["max_concurrent"] is None
    assert client.post("/_sim/faults", json={"max_concurrent": 2}).json()["max_concurrent"] == 2
    assert json.loads(client.get("/_sim/faults").content)["max_concurrent"] == 2


