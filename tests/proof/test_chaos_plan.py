"""The chaos run's plan (pure): the sync jobs are a real share of the mix,
each one's body is its own, its controls are the ones its simulator route
applies (a control it refused would make every such job fail, and the run
prove nothing), and the models file it writes is one the service accepts."""
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
from proof.chaos import LLM_MAX_TOKENS, SPEECH_MODEL, ChaosConfig, models_file, plan_jobs, shaped_input


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
            assert set(p.input) <= {"text", "model_id", "duration_s", "output_bytes", "outcome"}
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
    entries = parse(models_file(config)).entries
    assert {(e.provider, e.model) for e in entries} == {
        ("anthropic", "claude-sonnet-4-5"), ("openai", "gpt-4o-mini"),
        ("elevenlabs", SPEECH_MODEL), ("elevenlabs", "sound-generation")}
    assert {(e.timeout_s, e.stale_after_s) for e in entries} == {(45, 60)}
    assert config.drain_timeout_s > 60  # a call lost with its worker is given up before the drain ends
