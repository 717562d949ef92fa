"""Text answers (`output_text`) instead of files, end to end through the
settler: real PostgreSQL, real HTTP, files storage, the adapters and the
settle step. Under the simulator's native protocol the text is the job's
one output, stored as text, and the task's reported cost is charged; under
fal's, the answer is stored whole as JSON."""
from __future__ import annotations

import hashlib
import json

from tests.outbox.conftest import assert_money_balances, succeeded_with_one_output
from tests.roads.conftest import provider_env

TEXT = "hello Alice \N{SLIGHTLY SMILING FACE}"


async def test_a_text_answer_is_one_text_output(web, make_owner, db, sim, make_settings, start_settler):
    server = await web(SIM_URL=sim.url)
    await start_settler(make_settings(SIM_URL=sim.url))
    owner = await make_owner(credits=100)
    job = {"provider": "sim", "model": "llm", "input": {"duration_s": 0.1, "output_text": TEXT, "cost": 3},
           "max_credits": 10}
    got, out, body = await succeeded_with_one_output(server, owner.api_key, db, job)
    expected = TEXT.encode()
    assert (out["index"], out["content_type"], out["bytes"]) == (0, "text/plain; charset=utf-8", len(expected))
    assert body == expected and out["sha256"] == hashlib.sha256(expected).hexdigest()
    assert got["credits"] == {"reserved": 10, "charged": 3, "refunded": 7}
    await assert_money_balances(db)


async def test_a_fal_text_answer_is_one_json_output(web, make_owner, db, sim, make_settings, start_settler):
    """fal's text models answer `{"output": ...}` with no file: the answer
    is stored whole (before, the job succeeded with nothing stored)."""
    env = provider_env(sim.url)
    server = await web(**env)
    await start_settler(make_settings(**env))
    owner = await make_owner(credits=100)
    job = {"provider": "fal", "model": "fal-ai/any-llm", "input": {"duration_s": 0.1, "output_text": TEXT},
           "max_credits": 10}
    got, out, body = await succeeded_with_one_output(server, owner.api_key, db, job)
    assert out["content_type"] == "application/json"
    assert json.loads(body) == {"output": TEXT}
    assert got["credits"] == {"reserved": 10, "charged": 10, "refunded": 0}  # fal reports no cost
    await assert_money_balances(db)
