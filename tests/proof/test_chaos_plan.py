"""The chaos run's plan (pure): the sync jobs are a real share of the mix,
each one's body is its own, its controls are the ones its simulator route
applies (a control it refused would make every such job fail, and the run
prove nothing), and the models file it writes is one the service accepts:
every sync model timed to the run, the prices of a real catalogue on
models the plan makes (the per-second ones asking for real media), and
caps that bind while the creates go in yet let the run drain."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from app.models_file import parse
from app.providers import provider_kind
from app.simulator import anthropic as sim_anthropic
from app.simulator import elevenlabs as sim_elevenlabs
from app.simulator import openai as sim_openai
from app.vocabulary import ProviderKind
from proof import invariants
from proof.chaos import (
    LLM_MAX_TOKENS,
    MODELS,
    SPEECH_MODEL,
    ChaosConfig,
    expected_jobs,
    models_file,
    plan_jobs,
    run_caps,
    shaped_input,
)


@pytest.fixture(scope="module")
def plans():
    return plan_jobs(ChaosConfig(jobs=3000), random.Random(7))


def _sync(plans):
    return [p for p in plans if provider_kind(p.provider, p.model) is ProviderKind.SYNC]


def test_sync_jobs_are_about_a_sixth_of_the_mix(plans):
    share = len(_sync(plans)) / len(plans)
    assert 0.12 <= share <= 0.20, share
    models = Counter((p.provider, p.model) for p in _sync(plans))
    assert set(models) == {("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4o-mini"),
                           ("elevenlabs", SPEECH_MODEL), ("elevenlabs", "sound-generation")}
    streamed = Counter(p.provider for p in _sync(plans) if p.input.get("stream"))
    assert 0.3 < streamed["anthropic"] / models[("anthropic", "claude-sonnet-4-5")] < 0.7
    assert 0.3 < streamed["openai"] / models[("openai", "gpt-4o-mini")] < 0.7


def test_every_sync_body_is_its_own(plans):
    bodies = Counter(json.dumps({"model": p.model, **p.input}, sort_keys=True) for p in _sync(plans))
    assert bodies.most_common(1)[0][1] == 1


def test_every_sync_input_is_accepted_by_its_simulator_route(plans):
    outcomes: Counter = Counter()
    for p in _sync(plans):
        if p.provider == "anthropic":
            call = sim_anthropic.parse_call({"model": p.model, **p.input})
            assert call.max_tokens == LLM_MAX_TOKENS and "outputs" not in p.input["metadata"]
            controls = call.controls
        elif p.provider == "openai":
            assert all(isinstance(v, str) for v in p.input["metadata"].values()), p.input
            controls = sim_openai.parse_call({"model": p.model, **p.input}).controls
        else:
            fields = sim_elevenlabs.TTS_FIELDS if p.model == SPEECH_MODEL else sim_elevenlabs.SFX_FIELDS
            assert sim_elevenlabs.check_body(p.input, fields) == []
            controls, _ = sim_elevenlabs.call_controls(p.input)
            assert controls.output_bytes == p.input["output_bytes"]
            assert set(p.input) <= {"text", "model_id", "duration_s", "output_bytes", "outcome", "output_duration_s"}
            assert controls.output_duration_s == p.input.get("output_duration_s")
        assert f"chaos job {p.index}" in json.dumps(p.input)
        outcomes[controls.outcome] += 1
    assert outcomes["failed"] and outcomes["succeeded"]


def test_openai_metadata_numbers_are_strings_the_simulator_reads_back():
    body = shaped_input("openai", "gpt-4o-mini", {"prompt": "chaos job 1", "duration_s": 2.5, "input_tokens": 7,
                                                  "output_tokens": 3, "outputs": 2, "cost": 9}, stream=True)
    assert body == {"max_tokens": LLM_MAX_TOKENS, "messages": [{"role": "user", "content": "chaos job 1"}],
                    "metadata": {"duration_s": "2.5", "input_tokens": "7", "output_tokens": "3"}, "stream": True}
    call = sim_openai.parse_call({"model": "gpt-4o-mini", **body})
    assert (call.controls.duration_s, call.input_tokens, call.output_tokens, call.stream) == (2.5, 7, 3, True)


def test_the_models_file_times_the_sync_models_to_the_run():
    config = ChaosConfig(long_duration_s=(15.0, 35.0))
    models = parse(models_file(config))
    for provider, names in MODELS.items():
        for model in names:
            if provider_kind(provider, model) is ProviderKind.SYNC:
                entry = models.match(provider, model)
                assert entry is not None and (entry.timeout_s, entry.stale_after_s) == (45, 60), (provider, model)
    assert all(e.timeout_s is None for e in models.entries if provider_kind(e.provider, e.model) is ProviderKind.ASYNC)
    assert config.drain_timeout_s > 60  # a call lost with its worker is given up before the drain ends


def test_the_models_file_prices_models_the_plan_makes_by_every_unit(plans):
    models = parse(models_file(ChaosConfig()))
    priced = Counter()
    for p in plans:
        entry = models.match(p.provider, p.model)
        if entry is not None and entry.price is not None:
            priced[entry.price.per] += 1
    # Every unit but `job`, each on a real share of the jobs.
    assert set(priced) == {"output", "second", "1k_tokens", "1k_characters", "provider"}
    assert min(priced.values()) >= 50, priced


def test_per_second_jobs_ask_for_real_media_and_speech_texts_vary(plans):
    """A per-second price is measured on the stored media: most such jobs
    ask for a WAV or MP4 of known seconds (the rest store bytes no reader
    knows: charged the reservation). Speech is priced per character."""
    models = parse(models_file(ChaosConfig()))
    per_second = [p for p in plans if (e := models.match(p.provider, p.model)) and e.price and e.price.per == "second"]
    with_media = [p for p in per_second if "output_duration_s" in invariants.controls_of(p.provider, p.input)]
    assert {p.model for p in per_second} == {"veo/veo3_fast", "sound-generation"}
    assert 0.75 < len(with_media) / len(per_second) < 0.98
    assert all(0.5 <= p.input["output_duration_s"] <= 3.0 for p in with_media)
    lengths = [len(p.input["text"]) for p in plans if p.model == SPEECH_MODEL]
    assert min(lengths) < 30 and max(lengths) > 500


@pytest.mark.parametrize("jobs", [200, 600, 5000])
def test_caps_bind_while_the_creates_go_in_and_let_the_run_drain(jobs):
    """Each cap has far fewer places than the creates would fill at once
    (jobs arriving at create_rate x their share, each holding a place
    cap_hold_s), and its jobs pass through in under half the drain timeout
    at cap_hold_s a place (fal's overdue ones holding theirs to their
    give-up deadline)."""
    config = ChaosConfig(jobs=jobs)
    provider_caps, entry_caps = run_caps(config)
    assert set(provider_caps) == {"fal"} and set(entry_caps) == {("sim", "image-*"), ("elevenlabs", "text-to-speech/*")}
    models = parse(models_file(config))
    assert {(e.provider, e.model): e.max_in_flight for e in models.entries if e.max_in_flight} == entry_caps
    for (provider, glob), cap in [((p, "*"), n) for p, n in provider_caps.items()] + list(entry_caps.items()):
        n = expected_jobs(config, provider, glob)
        hold_s = config.cap_hold_s + (config.overdue_share * config.give_up_after_s_fal if provider == "fal" else 0)
        asked_at_once = config.create_rate * n / config.jobs * hold_s
        assert cap < asked_at_once, (provider, glob, cap, asked_at_once)
        assert n * hold_s / cap < config.drain_timeout_s / 2, (provider, glob, cap)
    assert run_caps(ChaosConfig(jobs=jobs, caps=False)) == ({}, {})


def test_the_caps_the_service_reads_are_the_runs():
    config = ChaosConfig(jobs=600)
    provider_caps, entry_caps = run_caps(config)
    caps = invariants.caps_of(parse(models_file(config)), {"MAX_IN_FLIGHT_FAL": str(provider_caps["fal"])})
    assert caps == [invariants.Cap("fal", provider_caps["fal"]),
                    invariants.Cap("elevenlabs", entry_caps["elevenlabs", "text-to-speech/*"], "text-to-speech/*"),
                    invariants.Cap("sim", entry_caps["sim", "image-*"], "image-*")]
