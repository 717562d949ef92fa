"""The models file: what it accepts, what it refuses (one line each), and
how the first matching entry's timings lie over a provider's facts."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from decimal import Decimal

import pytest

from app.config import ConfigError, load_settings
from app.models_file import ModelsFileError, Price, entry_kind, glob_problem, may_be_sync, parse
from app.providers.base import ProviderFacts, ProviderKind

# The first entry is CONTRACT.md's example, verbatim (its timeout_s on an
# async model is accepted and changes nothing).
EXAMPLE = """
[[models]]
provider = "kie"
model = "veo/*"
stale_after_s = 1500          # with a webhook registered: ask the provider anyway this long after submit
poll_every_s = [5, 10, 30]    # without one: successive intervals between checks, the last repeating
give_up_after_s = 5400
timeout_s = 600              # sync models: the call's own timeout
max_in_flight = 20            # these jobs submitted and not yet closed, across all settlers
price = { credits = 3, per = "second" }   # per: "job", "output", "second" (of output audio/video),
                                          # "1k_tokens" (input + output), "1k_characters", "provider"

[[models]]
provider = "anthropic"
model = "claude-*"
timeout_s = 300
price = { credits = 0.8, per = "1k_tokens" }

[[models]]
provider = "kie"
model = "*"
"""

ASYNC = ProviderFacts(name="kie", webhook_scheme="capability-url", idempotent_submit=False, can_find=False,
                      stale_after_s=60.0, poll_delays_s=(2.0, 3.0))
SYNC = ProviderFacts(name="anthropic", webhook_scheme="none", idempotent_submit=False, can_find=False,
                     stale_after_s=900.0, kind=ProviderKind.SYNC, call_timeout_s=600.0)


def test_the_contract_example_parses_with_exact_decimals():
    models = parse(EXAMPLE)
    veo = models.match("kie", "veo/veo3_fast")
    assert veo is not None and veo.stale_after_s == 1500 and veo.poll_every_s == (5.0, 10.0, 30.0)
    assert veo.give_up_after_s == 5400 and veo.max_in_flight == 20 and veo.price == Price(Decimal(3), "second")
    claude = models.match("anthropic", "claude-sonnet-4-5")
    assert claude is not None and claude.price == Price(Decimal("0.8"), "1k_tokens")


def test_the_first_match_wins_and_globs_are_case_sensitive():
    models = parse(EXAMPLE)
    assert models.match("kie", "veo/x") is models.entries[0]
    assert models.match("kie", "flux-kontext/pro") is models.entries[2]
    assert models.match("kie", "VEO/x") is models.entries[2]
    assert models.match("anthropic", "Claude-x") is None
    assert models.match("fal", "veo/x") is None


def test_an_entry_lays_its_timings_over_the_facts_and_keeps_the_rest():
    models = parse(EXAMPLE)
    veo = models.apply("kie", "veo/veo3", ASYNC)
    assert (veo.stale_after_s, veo.poll_delays_s, veo.give_up_after_s) == (1500.0, (5.0, 10.0, 30.0), 5400.0)
    assert veo.webhook_scheme == ASYNC.webhook_scheme
    # Its timeout_s is a sync call's: an async model's facts keep their own.
    assert models.match("kie", "veo/veo3").timeout_s == 600.0
    odd = dataclasses.replace(ASYNC, call_timeout_s=42.0)
    assert models.apply("kie", "veo/veo3", odd).call_timeout_s == 42.0
    assert models.apply("kie", "other", ASYNC) == ASYNC  # an entry without timings changes nothing
    assert models.apply("fal", "x", ASYNC) == ASYNC  # no entry


def test_a_sync_timeout_moves_the_lost_call_threshold_with_it():
    claude = parse(EXAMPLE).apply("anthropic", "claude-x", SYNC)
    assert (claude.call_timeout_s, claude.stale_after_s) == (300.0, 600.0)
    both = parse('[[models]]\nprovider = "openai"\nmodel = "*"\ntimeout_s = 10\nstale_after_s = 12\n')
    assert (both.apply("openai", "gpt", SYNC).call_timeout_s, both.apply("openai", "gpt", SYNC).stale_after_s) \
        == (10.0, 12.0)


ENTRY = '[[models]]\nprovider = "{provider}"\nmodel = "{model}"\n'


@pytest.mark.parametrize(("text", "says"), [
    ("not = [toml", "is not valid TOML"),
    ('title = "x"\n', "unknown top-level key 'title'"),
    ('models = "x"\n', "must be an array of tables"),
    (ENTRY.format(provider="nope", model="*"), "provider must be one of"),
    ('[[models]]\nprovider = "kie"\n', "model must be a string"),
    (ENTRY.format(provider="kie", model="") , "model '' is empty"),
    (ENTRY.format(provider="kie", model="veo/[abc"), "never closed"),
    (ENTRY.format(provider="kie", model="veo *"), "blank or control characters"),
    (ENTRY.format(provider="kie", model="*") + "colour = 1\n", "unknown key 'colour'"),
    (ENTRY.format(provider="kie", model="*") + "stale_after_s = -1\n", "stale_after_s must be a number"),
    (ENTRY.format(provider="kie", model="*") + "stale_after_s = 0\n", "stale_after_s must be a number"),
    (ENTRY.format(provider="kie", model="*") + 'give_up_after_s = "1h"\n', "give_up_after_s must be a number"),
    (ENTRY.format(provider="kie", model="*") + "poll_every_s = []\n", "poll_every_s must be a non-empty list"),
    (ENTRY.format(provider="kie", model="*") + "poll_every_s = [5, -1]\n", "poll_every_s must be a non-empty"),
    (ENTRY.format(provider="kie", model="*") + "max_in_flight = 0\n", "max_in_flight must be a whole number"),
    (ENTRY.format(provider="kie", model="*") + "max_in_flight = 2.5\n", "max_in_flight must be a whole number"),
    # The capacity statements count in PostgreSQL's integer: one more would fail every submit.
    (ENTRY.format(provider="kie", model="*") + "max_in_flight = 2147483648\n",
     "max_in_flight must be a whole number from 1 to 2147483647"),
    (ENTRY.format(provider="kie", model="*") + 'price = { credits = 1, per = "minute" }\n',
     "price.per must be one of job, output, second, 1k_tokens, 1k_characters, provider, not 'minute'"),
    (ENTRY.format(provider="kie", model="*") + 'price = { credits = -1, per = "job" }\n', "price.credits must be"),
    (ENTRY.format(provider="kie", model="*") + 'price = { credits = 1, per = "job", cap = 3 }\n',
     "unknown price key 'cap'"),
    (ENTRY.format(provider="kie", model="*") + "price = 3\n", "price must be a table"),
    (ENTRY.format(provider="anthropic", model="*") + "stale_after_s = 60\n",
     "stale_after_s 60 is shorter than the call's timeout_s 600"),
    (ENTRY.format(provider="openai", model="*") + "timeout_s = 120\nstale_after_s = 119\n",
     "stale_after_s 119 is shorter than the call's timeout_s 120"),
    (ENTRY.format(provider="elevenlabs", model="*") + "stale_after_s = 30\n", "is shorter than the call's"),
])
def test_a_bad_file_is_one_line_that_says_what_and_where(text, says):
    with pytest.raises(ModelsFileError) as caught:
        parse(text)
    message = str(caught.value)
    assert says in message and "\n" not in message


def test_elevenlabs_dubbing_alone_is_async():
    # Dubbing is polled: its stale_after_s is not a call threshold.
    assert parse(ENTRY.format(provider="elevenlabs", model="dubbing") + "stale_after_s = 30\n").entries
    assert parse(ENTRY.format(provider="elevenlabs", model="dub*") + "stale_after_s = 30\n").entries
    with pytest.raises(ModelsFileError, match="shorter than the call's timeout_s"):
        parse(ENTRY.format(provider="elevenlabs", model="text-to-*") + "stale_after_s = 30\n")


@pytest.mark.parametrize(("provider", "glob", "sync", "kind"), [
    ("elevenlabs", "dubbing", False, "async"),
    ("elevenlabs", "dub*", False, "async"),  # matches dubbing alone
    ("elevenlabs", "d?bbing", False, "async"),
    ("elevenlabs", "sound-generation", True, "sync"),
    ("elevenlabs", "sound-*", True, "sync"),
    ("elevenlabs", "text-to-speech/JBFqnCBsd6RMkjVDRZzb", True, "sync"),
    ("elevenlabs", "text-to-speech/*", True, "sync"),
    ("elevenlabs", "text*", True, "sync"),
    ("elevenlabs", "*", True, "sync"),  # both kinds: a call threshold must hold for its sync ones
    ("elevenlabs", "[st]*", True, "sync"),
    ("anthropic", "claude-*", True, "sync"),
    ("kie", "veo/*", False, "async"),
])
def test_which_entries_may_match_a_sync_model(provider, glob, sync, kind):
    assert may_be_sync(provider, glob) is sync and entry_kind(provider, glob).value == kind


@pytest.mark.parametrize(("glob", "problem"), [
    ("veo/*", None), ("[!a]x", None), ("[]]", None), ("a[bc]d", None), ("[", "has a `[` that is never closed"),
    ("a[!", "has a `[` that is never closed"), ("", "is empty"), ("a\tb", "has blank or control characters"),
])
def test_glob_problems(glob, problem):
    assert glob_problem(glob) == problem


def test_settings_read_the_file_and_a_bad_one_is_a_config_error(tmp_path):
    good = tmp_path / "models.toml"
    good.write_text(EXAMPLE)
    env = {"DATABASE_URL": "postgresql://x/y", "SECRET_KEY": "k" * 32, "MODELS_FILE": str(good)}
    settings = load_settings(env)
    assert settings.give_up_after("kie", 3600.0, model="veo/x") == 5400.0
    assert settings.give_up_after("kie", 3600.0, model="runway/x") == 3600.0
    with pytest.raises(ConfigError, match="cannot be read"):
        load_settings({**env, "MODELS_FILE": str(tmp_path / "missing.toml")})


@pytest.mark.parametrize("command", ["settler", "serve"])
def test_the_service_refuses_to_start_on_a_bad_file_with_one_line_and_exit_2(tmp_path, command):
    bad = tmp_path / "models.toml"
    bad.write_text(ENTRY.format(provider="kie", model="*") + "colour = 1\n")
    env = {"DATABASE_URL": "postgresql://127.0.0.1:1/none", "SECRET_KEY": "k" * 32, "MODELS_FILE": str(bad),
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "app", command], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'colour'" in lines[0]
