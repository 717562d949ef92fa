// The owners API (a platform owner's key) and acting for an owner, against a real longcall started with
// the launcher's --platform: an ordinary owner (api_key) and a platform one (platform_api_key).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import {
  Client,
  ConnectionError,
  IdempotencyConflictError,
  InsufficientCreditsError,
  LongcallError,
  NotFoundError,
  type Owner,
} from "longcall-client";

import { type Longcall, QUICK_JOB, startLongcall } from "./support/longcall.js";
import type { Running } from "./support/process.js";
import { startProxy } from "./support/proxy.js";

const OWNER_ID = /^own_[0-9a-f]{24}$/;
const MISSING_OWNER = `own_${"0".repeat(24)}`;
const NO_SUCH_OWNER = { code: "not_found", message: "no such owner" };

let server: Running<Longcall>;
let lc: Longcall;
let platformKey: string;
/** The platform's key. */
let platform: Client;
/** The ordinary owner's key. */
let ordinary: Client;

before(async () => {
  server = await startLongcall({ credits: 100_000, platform: true });
  lc = server.info;
  assert.ok(lc.platform_api_key && lc.platform_owner_id, "the launcher made a platform owner");
  platformKey = lc.platform_api_key;
  platform = new Client({ baseUrl: lc.base_url, apiKey: platformKey });
  ordinary = new Client({ baseUrl: lc.base_url, apiKey: lc.api_key });
}, { timeout: 180_000 });

after(async () => {
  await server?.stop();
});

/** Rejects with `Class`, `code` and `status` (and, given, exactly `message`); no key in the message. */
async function rejectsWith(promise: Promise<unknown>, Class: typeof LongcallError, code: string, status: number,
  message?: string) {
  const err = await promise.then(() => assert.fail(`expected ${Class.name}`), (e: unknown) => e);
  assert.ok(err instanceof Class, `expected ${Class.name}, got ${String(err)}`);
  assert.equal(err.code, code);
  assert.equal(err.status, status);
  if (message !== undefined) assert.equal(err.message, message);
  for (const key of [lc.api_key, platformKey]) assert.ok(!err.message.includes(key));
  return err;
}

function newName(): string {
  return `ts-${randomUUID()}`;
}

describe("owners", () => {
  test("create answers the owner; the same key again gives the same owner, made once", async () => {
    const key = `ts-${randomUUID()}`;
    const name = newName();
    const before = Date.now();
    const created = await platform.owners.create({ name, credits: 500, maxActive: 3, idempotencyKey: key });
    assert.match(created.owner_id, OWNER_ID);
    assert.notEqual(created.owner_id, lc.platform_owner_id);
    assert.equal(created.name, name);
    assert.deepEqual(created.credits, { granted: 500, balance: 500, reserved: 0, charged: 0 });
    assert.equal(created.active, 0);
    assert.equal(created.max_active, 3);
    assert.match(created.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/);
    // A loose bound: only that the time is today's, in UTC, not a fixed or local one.
    assert.ok(Math.abs(Date.parse(created.created_at) - before) < 10 * 60_000, created.created_at);

    const replay = await platform.owners.create({ name, credits: 500, maxActive: 3, idempotencyKey: key });
    assert.deepEqual(replay, created);
    const named = await listAll((o) => o.name === name);
    assert.deepEqual(named.map((o) => o.owner_id), [created.owner_id], "one owner, not two");

    await rejectsWith(platform.owners.create({ name, credits: 501, maxActive: 3, idempotencyKey: key }),
      IdempotencyConflictError, "idempotency_conflict", 409);
    assert.deepEqual(await platform.owners.get(created.owner_id), created, "the conflict changed nothing");
  });

  test("create without credits or maxActive: the server's defaults (0 and 10)", async () => {
    const owner = await platform.owners.create({ name: newName() });
    assert.deepEqual(owner.credits, { granted: 0, balance: 0, reserved: 0, charged: 0 });
    assert.equal(owner.max_active, 10);
    // Without a key of ours the client makes one per call: a second call is a second owner.
    const other = await platform.owners.create({ name: owner.name });
    assert.notEqual(other.owner_id, owner.owner_id);
  });

  test("list pages through every owner, newest first, each once", async () => {
    const made: Owner[] = [];
    for (let i = 0; i < 3; i++) made.push(await platform.owners.create({ name: newName() }));
    const first = await platform.owners.list({ limit: 2 });
    assert.equal(first.owners.length, 2);
    assert.ok(first.next_cursor, "more than two owners: a cursor");
    // The newest first: the last one made leads.
    assert.equal(first.owners[0]!.owner_id, made[2]!.owner_id);
    assert.equal(first.owners[1]!.owner_id, made[1]!.owner_id);

    const all = await listAll(() => true, 2);
    const ids = all.map((o) => o.owner_id);
    assert.equal(new Set(ids).size, ids.length, "no owner twice across pages");
    for (const owner of made) assert.ok(ids.includes(owner.owner_id));
    assert.ok(!ids.includes(lc.owner_id), "the ordinary owner is not under this platform");
    assert.ok(!ids.includes(lc.platform_owner_id!), "nor is the platform itself");
    const times = all.map((o) => Date.parse(o.created_at));
    assert.deepEqual(times, [...times].sort((x, y) => y - x));
    assert.deepEqual(all.find((o) => o.owner_id === made[0]!.owner_id), made[0]);
  });

  test("get answers the owner; one not under this platform, unknown or malformed is NotFoundError",
    async () => {
      const owner = await platform.owners.create({ name: newName(), credits: 7 });
      assert.deepEqual(await platform.owners.get(owner.owner_id), owner);
      for (const id of [lc.owner_id, MISSING_OWNER, "own_nope", "job_0123"]) {
        await rejectsWith(platform.owners.get(id), NotFoundError, NO_SUCH_OWNER.code, 404, NO_SUCH_OWNER.message);
      }
    });

  test("grant +100 then -30; the same key again moves nothing; too large a claw-back changes nothing",
    async () => {
      const owner = await platform.owners.create({ name: newName() });
      const plus = await platform.owners.grant(owner.owner_id, 100, { reason: "welcome" });
      assert.equal(plus.owner_id, owner.owner_id);
      assert.deepEqual(plus.credits, { granted: 100, balance: 100, reserved: 0, charged: 0 });

      const key = `ts-${randomUUID()}`;
      const minus = await platform.owners.grant(owner.owner_id, -30, { idempotencyKey: key });
      assert.deepEqual(minus.credits, { granted: 70, balance: 70, reserved: 0, charged: 0 });
      const replay = await platform.owners.grant(owner.owner_id, -30, { idempotencyKey: key });
      assert.equal(replay.owner_id, owner.owner_id);
      assert.equal((await platform.owners.get(owner.owner_id)).credits.balance, 70, "taken back once");
      await rejectsWith(platform.owners.grant(owner.owner_id, -31, { idempotencyKey: key }),
        IdempotencyConflictError, "idempotency_conflict", 409);

      await rejectsWith(platform.owners.grant(owner.owner_id, -71), InsufficientCreditsError,
        "insufficient_credits", 402);
      assert.deepEqual(await platform.owners.get(owner.owner_id), { ...owner,
        credits: { granted: 70, balance: 70, reserved: 0, charged: 0 } });
      // Exactly the balance may go.
      assert.deepEqual((await platform.owners.grant(owner.owner_id, -70)).credits,
        { granted: 0, balance: 0, reserved: 0, charged: 0 });
      await rejectsWith(platform.owners.grant(MISSING_OWNER, 5), NotFoundError, NO_SUCH_OWNER.code, 404,
        NO_SUCH_OWNER.message);
    });

  test("credits reserved by a running job cannot be taken back", { timeout: 30_000 }, async () => {
    const owner = await platform.owners.create({ name: newName(), credits: 100 });
    const job = await platform.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "slow", duration_s: 120 }, maxCredits: 60, owner: owner.owner_id });
    try {
      await rejectsWith(platform.owners.grant(owner.owner_id, -41), InsufficientCreditsError,
        "insufficient_credits", 402);
      const after = await platform.owners.grant(owner.owner_id, -40);
      assert.deepEqual(after.credits, { granted: 60, balance: 0, reserved: 60, charged: 0 });
    } finally {
      await platform.jobs.cancel(job.id, { owner: owner.owner_id });
    }
    assert.deepEqual((await platform.owners.get(owner.owner_id)).credits,
      { granted: 60, balance: 60, reserved: 0, charged: 0 }, "the cancel refunded the reservation");
  });

  test("answers lost after the server acted: the retries reuse the key, one owner, one grant",
    { timeout: 30_000 }, async () => {
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-drop" }, { kind: "forward" },
        { kind: "forward-then-drop" }]);
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: platformKey });
        const name = newName();
        const owner = await via.owners.create({ name, credits: 10 });
        const [lost, retried] = proxy.seen;
        assert.equal(lost!.answer?.status, 201, "the first attempt made the owner");
        assert.equal(retried!.answer?.status, 200, "the retry was answered as a replay");
        assert.ok(lost!.headers["idempotency-key"]);
        assert.equal(retried!.headers["idempotency-key"], lost!.headers["idempotency-key"]);
        assert.equal(JSON.parse(lost!.answer!.body).owner_id, owner.owner_id);
        assert.equal((await listAll((o) => o.name === name)).length, 1);

        const granted = await via.owners.grant(owner.owner_id, 5);
        assert.equal(proxy.seen.length, 4);
        const [, , grantLost, grantRetried] = proxy.seen;
        assert.equal(grantLost!.answer?.status, 201);
        assert.equal(grantRetried!.answer?.status, 200);
        assert.equal(grantRetried!.headers["idempotency-key"], grantLost!.headers["idempotency-key"]);
        assert.equal(granted.owner_id, owner.owner_id);
        assert.deepEqual((await platform.owners.get(owner.owner_id)).credits,
          { granted: 15, balance: 15, reserved: 0, charged: 0 }, "granted once");
      } finally {
        await proxy.close();
      }
    });

  test("a grant's answer cut mid-body: the retry, same key, grants once", { timeout: 30_000 }, async () => {
    const owner = await platform.owners.create({ name: newName() });
    const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-cut-body" }]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: platformKey });
      const granted = await via.owners.grant(owner.owner_id, 100);  // before: TypeError: terminated
      assert.equal(proxy.seen.length, 2);
      const [cut, retried] = proxy.seen;
      assert.equal(cut!.answer?.status, 201, "the first attempt granted");
      assert.ok(cut!.partial, "its headers and half its body went out");
      assert.equal(retried!.answer?.status, 200, "the retry was answered as a replay");
      assert.equal(retried!.headers["idempotency-key"], cut!.headers["idempotency-key"]);
      assert.equal(granted.credits.granted, 100);
      assert.deepEqual((await platform.owners.get(owner.owner_id)).credits,
        { granted: 100, balance: 100, reserved: 0, charged: 0 }, "granted once");
    } finally {
      await proxy.close();
    }
  });

  test("once the retries run out, a grant's or create's error carries its key: sent again with it, once",
    { timeout: 30_000 }, async () => {
      const owner = await platform.owners.create({ name: newName() });
      const name = newName();
      // Each call reaches the server twice; no answer gets back (lost; for the create, lost then cut mid-body).
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-drop" }, { kind: "forward-then-drop" },
        { kind: "forward-then-drop" }, { kind: "forward-then-cut-body" }]);
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: platformKey, maxRetries: 1 });
        const grantErr = await rejectsWith(via.owners.grant(owner.owner_id, 40, { reason: "top-up" }), ConnectionError,
          "connection_error", 0);
        const keys = proxy.seen.map((r) => r.headers["idempotency-key"]);
        assert.deepEqual(keys, [keys[0], keys[0]]);
        assert.equal(grantErr.idempotencyKey, keys[0], "the grant's key, on its error");  // before: undefined
        assert.equal(proxy.seen[0]!.answer?.status, 201, "the server granted");
        const createErr = await rejectsWith(via.owners.create({ name, credits: 5 }), ConnectionError,
          "connection_error", 0);
        assert.equal(proxy.seen.length, 4);
        assert.equal(proxy.seen[3]!.headers["idempotency-key"], proxy.seen[2]!.headers["idempotency-key"]);
        assert.equal(createErr.idempotencyKey, proxy.seen[2]!.headers["idempotency-key"]);

        // The caller's own retry, with the key from the error: a replay, nothing moves twice.
        await platform.owners.grant(owner.owner_id, 40, { reason: "top-up", idempotencyKey: grantErr.idempotencyKey! });
        assert.deepEqual((await platform.owners.get(owner.owner_id)).credits,
          { granted: 40, balance: 40, reserved: 0, charged: 0 }, "granted once");
        const made = await platform.owners.create({ name, credits: 5, idempotencyKey: createErr.idempotencyKey! });
        assert.equal(made.owner_id, JSON.parse(proxy.seen[2]!.answer!.body).owner_id);
        assert.equal((await listAll((o) => o.name === name)).length, 1, "one owner");
      } finally {
        await proxy.close();
      }
    });

  test("a key that is not a platform's gets NotFoundError from the owners routes", async () => {
    await rejectsWith(ordinary.owners.create({ name: newName() }), NotFoundError, "not_found", 404);
    await rejectsWith(ordinary.owners.list(), NotFoundError, "not_found", 404);
    const owner = await platform.owners.create({ name: newName() });
    await rejectsWith(ordinary.owners.get(owner.owner_id), NotFoundError, "not_found", 404);
    await rejectsWith(ordinary.owners.grant(owner.owner_id, 5), NotFoundError, "not_found", 404);
    assert.equal((await platform.owners.get(owner.owner_id)).credits.granted, 0);
  });
});

describe("acting for an owner", () => {
  test("a job created with `owner` is that owner's: its money, read back for it", { timeout: 60_000 },
    async () => {
      const owner = await platform.owners.create({ name: newName(), credits: 50 });
      // No other test in this file spends the platform's own credits: they must not move here.
      const platformBefore = await platform.account.get();
      const created = await platform.jobs.create({ ...QUICK_JOB, maxCredits: 10, owner: owner.owner_id });
      assert.equal(created.owner_id, owner.owner_id);
      assert.equal(created.credits.reserved, 10);
      const read = await platform.jobs.get(created.id, { owner: owner.owner_id });
      assert.equal(read.id, created.id);
      assert.equal(read.owner_id, owner.owner_id);
      const listed = await platform.jobs.list({ owner: owner.owner_id });
      assert.deepEqual(listed.jobs.map((j) => j.id), [created.id]);

      const job = await platform.jobs.wait(created.id, { owner: owner.owner_id, timeoutMs: 45_000 });
      assert.equal(job.status, "succeeded", JSON.stringify(job.error));
      const account = await platform.account.get({ owner: owner.owner_id });
      assert.equal(account.owner_id, owner.owner_id);
      assert.equal(account.credits.charged, job.credits.charged);
      assert.equal(account.credits.balance, 50 - job.credits.charged);
      const after = await platform.owners.get(owner.owner_id);
      assert.deepEqual(after.credits, { granted: 50, balance: 50 - job.credits.charged, reserved: 0,
        charged: job.credits.charged });
      assert.equal(after.active, 0);
      assert.deepEqual(await platform.account.get(), platformBefore, "the platform's own money never moved");
    });

  test("the client's default `owner` acts for it, and stays off the owners calls", async () => {
    const owner = await platform.owners.create({ name: newName(), credits: 20 });
    const acting = new Client({ baseUrl: lc.base_url, apiKey: platformKey, owner: owner.owner_id });
    assert.equal((await acting.account.get()).owner_id, owner.owner_id);
    // The server refuses a Longcall-Owner on /v1/owners (400): these working shows it was not sent.
    assert.deepEqual(await acting.owners.get(owner.owner_id), await platform.owners.get(owner.owner_id));
    assert.ok((await acting.owners.list({ limit: 1 })).owners.length === 1);
    const made = await acting.owners.create({ name: newName() });
    assert.match(made.owner_id, OWNER_ID);
    assert.equal((await acting.owners.grant(made.owner_id, 3)).credits.balance, 3);
  });

  test("an owner not under this platform, unknown, malformed, or with a non-platform key: the same 404",
    async () => {
      const theirs = await platform.owners.create({ name: newName(), credits: 5 });
      const cases: Array<[Client, string]> = [
        [platform, lc.owner_id], [platform, MISSING_OWNER], [platform, "own_nope"], [platform, "nonsense"],
        [ordinary, theirs.owner_id], [ordinary, lc.owner_id],
      ];
      for (const [client, owner] of cases) {
        await rejectsWith(client.account.get({ owner }), NotFoundError, NO_SUCH_OWNER.code, 404,
          NO_SUCH_OWNER.message);
        await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: 1, owner }), NotFoundError,
          NO_SUCH_OWNER.code, 404, NO_SUCH_OWNER.message);
      }
      assert.deepEqual((await platform.owners.get(theirs.owner_id)).credits,
        { granted: 5, balance: 5, reserved: 0, charged: 0 }, "nothing reserved by the refused creates");
    });
});

/** Every owner under the platform matching `match`, following the cursor. */
async function listAll(match: (owner: Owner) => boolean, limit = 100): Promise<Owner[]> {
  const found: Owner[] = [];
  let cursor: string | null = null;
  for (let pages = 0; pages < 1000; pages++) {
    const page = await platform.owners.list({ limit, cursor });
    found.push(...page.owners.filter(match));
    cursor = page.next_cursor;
    if (cursor === null) return found;
  }
  throw new Error("more than 1000 pages of owners");
}
