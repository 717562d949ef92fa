"""The invariants of a platform's owners (CONTRACT.md: Apps with many
users): each grant its client was answered as moved is exactly one ledger
row under its key with its amount and reason, a refused one none, no row
the client never sent; the platform's owners are the ones it made, none a
platform, each job its owner's; and the money check per owner holds with
claw-backs (negative grants).

Tables of rows that keep them pass; each kind of violation, made one at a
time, is caught. Then the same checks over rows the real statements wrote
(app/domain/owners.py), broken in the database."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from app.domain import jobs, owners
from proof import invariants
from proof.invariants import GrantRow, GrantSent, OwnerMade, OwnerRow

MOVED, REFUSED, UNANSWERED = invariants.GRANT_MOVED, invariants.GRANT_REFUSED, invariants.GRANT_UNANSWERED


class Grants:
    """o1 was made with 25 opening credits, o2 with none. o1 was funded
    (g1), clawed back (g2), refused a claw-back past its balance (g3); o2
    was funded (g4, whose answer was lost and then retried: still one row)
    and one grant never got an answer (g5, which did move)."""

    def __init__(self):
        self.made = [OwnerMade("o1", "c1", 25), OwnerMade("o2", "c2", 0)]
        self.sent = [GrantSent("o1", "g1", 100, "funds", MOVED),
                     GrantSent("o1", "g2", -30, None, MOVED),
                     GrantSent("o1", "g3", -500, "too much", REFUSED),
                     GrantSent("o2", "g4", 80, None, MOVED),
                     GrantSent("o2", "g5", 5, None, UNANSWERED)]
        self.rows = [GrantRow("o1", 25, None, None),
                     GrantRow("o1", 100, "funds", "g1"),
                     GrantRow("o1", -30, None, "g2"),
                     GrantRow("o2", 80, None, "g4"),
                     GrantRow("o2", 5, None, "g5")]

    def check(self) -> list[str]:
        return invariants.grant_problems(self.made, self.sent, self.rows)


def _replace(rows: list, match: Callable, **changes) -> None:
    [i] = [i for i, row in enumerate(rows) if match(row)]
    rows[i] = rows[i]._replace(**changes)


def test_grant_rows_as_answered_pass():
    assert Grants().check() == []
    world = Grants()
    world.rows.remove(GrantRow("o2", 5, None, "g5"))  # unanswered: it may not have moved either
    assert world.check() == []


BROKEN_GRANTS = [
    ("a replay moved the money twice", lambda w: w.rows.append(GrantRow("o1", 100, "funds", "g1")),
     ["o1 grant g1 (+100, moved): 2 ledger rows, one expected"]),
    ("a grant answered 201 left no row", lambda w: w.rows.remove(GrantRow("o1", -30, None, "g2")),
     ["o1 grant g2 (-30, moved): 0 ledger rows, one expected"]),
    ("a row of another amount", lambda w: _replace(w.rows, lambda r: r.request_key == "g2", amount=-3),
     ["o1 grant g2 (-30, moved): the row says -3 for None, the client asked None"]),
    ("a row of another reason", lambda w: _replace(w.rows, lambda r: r.request_key == "g1", reason="other"),
     ["o1 grant g1 (+100, moved): the row says +100 for 'other', the client asked 'funds'"]),
    ("a refused claw-back left its row", lambda w: w.rows.append(GrantRow("o1", -500, "too much", "g3")),
     ["o1 grant g3 (-500, refused): refused, yet 1 ledger row(s)"]),
    ("an unanswered grant moved twice", lambda w: w.rows.append(GrantRow("o2", 5, None, "g5")),
     ["o2 grant g5 (+5, unanswered): 2 ledger rows"]),
    ("a row under a key never sent", lambda w: w.rows.append(GrantRow("o2", 7, None, "g9")),
     ["o2: 1 grant row(s) under key g9 no client sent"]),
    ("a row under another owner's key", lambda w: _replace(w.rows, lambda r: r.request_key == "g4", owner_id="o1"),
     ["o2 grant g4 (+80, moved): 0 ledger rows, one expected", "o1: 1 grant row(s) under key g4 no client sent"]),
    ("an opening grant lost", lambda w: w.rows.remove(GrantRow("o1", 25, None, None)),
     ["o1: opening grant rows [], its create asked for [25]"]),
    ("an opening grant for an owner made with none", lambda w: w.rows.append(GrantRow("o2", 10, None, None)),
     ["o2: opening grant rows [10], its create asked for []"]),
    ("a second keyless grant", lambda w: w.rows.append(GrantRow("o1", 25, None, None)),
     ["o1: opening grant rows [25, 25], its create asked for [25]"]),
    ("a grant row of an owner the client never made", lambda w: w.rows.append(GrantRow("o9", 10, None, None)),
     ["o9: 1 keyless grant row(s) no client sent, an owner the client never made"]),
]


@pytest.mark.parametrize("name, breaks, expected", BROKEN_GRANTS, ids=[b[0] for b in BROKEN_GRANTS])
def test_each_grant_violation_is_caught(name, breaks, expected):
    world = Grants()
    breaks(world)
    assert sorted(world.check()) == sorted(expected)


class Owners:
    """Platform p made o1 and o2 (keys c1, c2); a is a plain owner. Jobs k1
    (a's), k2 (o1's), k3 (o2's), k4 (no client made it: another check's)."""

    def __init__(self):
        self.made = [OwnerMade("o1", "c1", 0), OwnerMade("o2", "c2", 0)]
        self.owners = [OwnerRow("p", True, None, None), OwnerRow("a", False, None, None),
                       OwnerRow("o1", False, "p", "c1"), OwnerRow("o2", False, "p", "c2")]
        self.job_owners = {"k1": "a", "k2": "o1", "k3": "o2", "k4": "a"}
        self.expected = {"k1": "a", "k2": "o1", "k3": "o2"}

    def check(self) -> list[str]:
        return invariants.platform_owner_problems("p", self.made, self.owners, self.job_owners, self.expected)


BROKEN_OWNERS = [
    ("a replayed create made a second owner", lambda w: w.owners.append(OwnerRow("o3", False, "p", "c1x")),
     ["o3: an owner under the platform that its client was never told of (key c1x)"]),
    ("an owner it was told of is gone", lambda w: w.owners.remove(OwnerRow("o2", False, "p", "c2")),
     ["o2: made by the platform's create c2, but gone"]),
    ("an owner it made is under nobody", lambda w: _replace(w.owners, lambda o: o.id == "o2", platform_id=None),
     ["o2: made by the platform's create c2, but under None"]),
    ("an owner under its create's other key", lambda w: _replace(w.owners, lambda o: o.id == "o1", request_key="c2"),
     ["o1: made under key c1, the row says c2"]),
    ("an owner under a platform that is a platform itself",
     lambda w: _replace(w.owners, lambda o: o.id == "o1", is_platform=True),
     ["o1: a platform under platform p"]),
    ("an owner under an owner that is no platform", lambda w: w.owners.append(OwnerRow("x", False, "a", "c9")),
     ["x: under a, which is no platform"]),
    ("the platform is not one", lambda w: _replace(w.owners, lambda o: o.id == "p", is_platform=False),
     ["p: not a platform owner (OwnerRow(id='p', is_platform=False, platform_id=None, request_key=None))",
      "o1: under p, which is no platform", "o2: under p, which is no platform"]),
    ("a job of the platform made for its owner", lambda w: w.job_owners.update(k2="p"),
     ["job key k2: its job belongs to p, the client made it for o1"]),
    ("a job of one owner made for another", lambda w: w.job_owners.update(k3="o1"),
     ["job key k3: its job belongs to o1, the client made it for o2"]),
    ("a plain owner's job given to a platform's owner", lambda w: w.job_owners.update(k1="o2"),
     ["job key k1: its job belongs to o2, the client made it for a"]),
]


def test_owners_as_made_pass():
    assert Owners().check() == []


@pytest.mark.parametrize("name, breaks, expected", BROKEN_OWNERS, ids=[b[0] for b in BROKEN_OWNERS])
def test_each_owner_violation_is_caught(name, breaks, expected):
    world = Owners()
    breaks(world)
    assert sorted(world.check()) == sorted(expected)


# --- over rows the real statements wrote ----------------------------------------------------

async def test_over_the_rows_grants_and_claw_backs_wrote(db, make_owner):
    """A platform makes two owners (one with opening credits, its create
    sent twice), grants, claws back, is refused a claw-back past the
    balance and sends a grant again; one owner runs a job. The checks hold
    over those rows, the money check with the negative grant included —
    then each is broken in the database and caught."""
    platform = await make_owner(credits=0, platform=True)
    p = platform.owner_id
    made, sent = [], []
    async with db.acquire() as conn:
        for key, credits in (("c1", 25), ("c2", 0)):
            owner, created = await owners.create_under(conn, p, name=key, credits=credits, max_active=10,
                                                       request_key=key)
            assert created
            made.append(OwnerMade(owner.id, key, credits))
        again, created = await owners.create_under(conn, p, name="c1", credits=25, max_active=10, request_key="c1")
        assert (again.id, created) == (made[0].owner_id, False)
        o1, o2 = made[0].owner_id, made[1].owner_id
        for owner_id, key, credits, reason in ((o1, "g1", 100, "funds"), (o1, "g2", -30, None),
                                               (o2, "g3", 50, "funds")):
            await owners.grant_under(conn, p, owner_id, credits=credits, reason=reason, request_key=key)
            sent.append(GrantSent(owner_id, key, credits, reason, MOVED))
        with pytest.raises(owners.InsufficientCredits):
            await owners.grant_under(conn, p, o2, credits=-51, reason=None, request_key="g4")
        sent.append(GrantSent(o2, "g4", -51, None, REFUSED))
        _, moved = await owners.grant_under(conn, p, o1, credits=-30, reason=None, request_key="g2")
        assert not moved  # the replay moved nothing
    await jobs.create_job(db, owner_id=o1, request_key="k1", provider="sim", model="m", input={}, max_credits=5,
                          give_up_after_s=3600)

    async def problems() -> dict[str, list[str]]:
        async with db.acquire() as conn:
            checks = [await invariants.grants_kept(conn, p, made, sent),
                      await invariants.platform_owners_kept(conn, p, made, {"k1": o1}),
                      await invariants.owner_money(conn)]
        return {c.name: c.violations for c in checks if c.violations}

    assert await problems() == {}
    async with db.acquire() as conn:
        check = await invariants.grants_kept(conn, p, made, sent)
        assert check.note == "2 grants and 1 claw-backs moved, 1 refused; 4 ledger rows"
        assert (await invariants.owner_money(conn)).note == "1 claw-back(s) among the grants"

    # A replay that moved the money again: a second row under another key the client never sent.
    await db.execute("insert into ledger (owner_id, kind, amount) values ($1, 'grant', -30)", o1)
    await db.execute("update owners set granted = granted - 30, balance = balance - 30 where id = $1", o1)
    assert set(await problems()) == {"each grant the platform was answered moved once, as answered"}
    await db.execute("delete from ledger where owner_id = $1 and kind = 'grant' and amount = -30 "
                     "and request_key is null", o1)
    await db.execute("update owners set granted = granted + 30, balance = balance + 30 where id = $1", o1)
    assert await problems() == {}

    # A claw-back whose counters moved but whose row is gone.
    await db.execute("delete from ledger where owner_id = $1 and request_key = 'g2'", o1)
    assert set(await problems()) == {"each grant the platform was answered moved once, as answered",
                                     "per owner: granted = balance + reserved + charged"}
    await db.execute("""insert into ledger (owner_id, kind, amount, request_key, request_digest)
                        values ($1, 'grant', -30, 'g2', '\\x00')""", o1)
    assert await problems() == {}

    # The job made for o1 belonging to o2.
    await db.execute("update jobs set owner_id = $1 where request_key = 'k1'", o2)
    assert set(await problems()) >= {"a platform's owners are the ones it made, each job its owner's"}
