// The client against a real longcall (server, settler, simulator, PostgreSQL), started once for this file.

import assert from "node:assert/strict";
import { createHash, randomUUID } from "node:crypto";
import { mkdtemp, readFile, readdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { inspect } from "node:util";

import {
  Client,
  ConnectionError,
  IdempotencyConflictError,
  InsufficientCreditsError,
  InvalidRequestError,
  InvalidStateError,
  type Job,
  LongcallError,
  NotFoundError,
  type NotificationPayload,
  UnauthenticatedError,
  UnavailableError,
  UnknownProviderError,
  verifyWebhook,
} from "longcall-client";

import { type Longcall, QUICK_JOB, startLongcall } from "./support/longcall.js";
import type { Running } from "./support/process.js";
import { type Action, startProxy } from "./support/proxy.js";
import { type Receiver, startReceiver } from "./support/receiver.js";

const CREDITS = 100_000;
const MISSING_JOB = `job_${"0".repeat(24)}`;

let server: Running<Longcall>;
let lc: Longcall;
let client: Client;
let receiver: Receiver;

before(async () => {
  // The receiver first: its origin is what longcall is told it may deliver to over plain http.
  receiver = await startReceiver();
  server = await startLongcall({ credits: CREDITS, env: { NOTIFY_ALLOWED_ORIGINS: receiver.origin } });
  lc = server.info;
  client = new Client({ baseUrl: lc.base_url, apiKey: lc.api_key });
}, { timeout: 180_000 });

after(async () => {
  await server?.stop();
  await receiver?.close();
});

function sha256(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** Rejects with `Class`, and its message never holds the API key. */
/** A create through a proxy that first answers `failures` (two): sent three times with one key, one job. */
async function createsOnceAfter(failures: Action[]): Promise<void> {
  const proxy = await startProxy(lc.base_url, failures);
  try {
    const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
    const job = await via.jobs.create({ ...QUICK_JOB, maxCredits: 2 });
    assert.equal(proxy.seen.length, 3);
    const keys = proxy.seen.map((s) => s.headers["idempotency-key"]);
    assert.ok(keys[0]);
    assert.deepEqual(keys, [keys[0], keys[0], keys[0]]);
    assert.equal((await client.jobs.get(job.id)).id, job.id);
  } finally {
    await proxy.close();
  }
}

async function rejectsWith(promise: Promise<unknown>, Class: typeof LongcallError, code: string, status: number) {
  const err = await promise.then(() => assert.fail(`expected ${Class.name}`), (e: unknown) => e);
  assert.ok(err instanceof Class, `expected ${Class.name}, got ${String(err)}`);
  assert.ok(err instanceof LongcallError);
  assert.equal(err.code, code);
  assert.equal(err.status, status);
  assert.ok(err.message.length > 0);
  assert.ok(!err.message.includes(lc.api_key) && !String(err.stack).includes(lc.api_key));
  return err;
}

/** A job that runs for two minutes, marked so the jobs a test made can be counted; cancelled by the test. */
function slowJob(mark: string) {
  return { provider: "sim", model: "image-fast", input: { prompt: mark, duration_s: 120 }, maxCredits: 3,
    metadata: { mark } };
}

/** The ids of the jobs carrying `mark` (among the newest hundred). */
async function jobsMarked(mark: string): Promise<string[]> {
  const { jobs } = await client.jobs.list({ limit: 100 });
  return jobs.filter((j) => j.metadata.mark === mark).map((j) => j.id);
}

async function cancelAll(ids: string[]): Promise<void> {
  for (const id of ids) await client.jobs.cancel(id).catch(() => undefined);
}

/** Resolves once the job is running: a long poll of it then waits its whole `?wait=` (nothing changes). */
async function untilRunning(jobId: string): Promise<Job> {
  for (const deadline = Date.now() + 30_000; ;) {
    const job = await client.jobs.get(jobId);
    if (job.status === "running" || Date.now() > deadline) return job;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("jobs", () => {
  test("create → wait → download: the bytes are the job's", { timeout: 60_000 }, async () => {
    const metadata = { order: "o-1", note: "café ☕", nested: { n: 1 } };
    const created = await client.jobs.create({ ...QUICK_JOB, maxCredits: 10, metadata });
    assert.match(created.id, /^job_[0-9a-f]{24}$/);
    assert.deepEqual(created.metadata, metadata);
    assert.equal(created.owner_id, lc.owner_id);
    assert.equal(created.credits.reserved, 10);
    assert.deepEqual(created.input, QUICK_JOB.input);

    const job = await client.jobs.wait(created.id, { timeoutMs: 45_000 });
    assert.equal(job.status, "succeeded", JSON.stringify(job.error));
    assert.ok(job.finished_at);
    assert.ok(job.outputs.length >= 1);
    assert.equal(job.credits.charged + job.credits.refunded, job.credits.reserved);
    const dir = await mkdtemp(join(tmpdir(), "longcall-download-"));
    for (const output of job.outputs) {
      const bytes = await client.jobs.download(job.id, output.index);
      assert.ok(bytes instanceof Uint8Array);
      assert.equal(bytes.byteLength, output.bytes);
      assert.equal(sha256(bytes), output.sha256);
      // With a path (CONTRACT.md: download(job_id, index, path)): the file, and what was written.
      const path = join(dir, `out-${output.index}`);
      const written = await client.jobs.download(job.id, output.index, path);
      assert.deepEqual(written, { path, bytes: output.bytes, sha256: output.sha256,
        contentType: output.content_type });
      assert.equal(sha256(await readFile(path)), output.sha256);
    }
    // A failed download leaves nothing behind: no file, no temporary part.
    await rejectsWith(client.jobs.download(job.id, 99, join(dir, "missing")), NotFoundError, "not_found", 404);
    assert.deepEqual((await readdir(dir)).sort(), job.outputs.map((o) => `out-${o.index}`).sort());
    const again = await client.jobs.get(job.id);
    assert.equal(again.status, "succeeded");
    assert.deepEqual(again.outputs, job.outputs);
    assert.deepEqual(again.credits, job.credits);
    assert.deepEqual(again.metadata, metadata);
  });

  test("a failing job comes back failed from wait, with its error", { timeout: 60_000 }, async () => {
    const created = await client.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "x", outcome: "failed" }, maxCredits: 5 });
    const job = await client.jobs.wait(created.id, { timeoutMs: 45_000 });
    assert.equal(job.status, "failed");
    assert.ok(job.error && job.error.code.length > 0);
    assert.equal(job.credits.charged, 0);
    assert.equal(job.credits.refunded, 5);
    assert.deepEqual(job.metadata, {});
  });

  test("wait's last poll ends at the deadline: ?wait= to the millisecond, not whole seconds", async () => {
    const asked: string[] = [];
    const recording = new Client({ baseUrl: lc.base_url, apiKey: lc.api_key, fetch: async (input, init) => {
      asked.push(new URL(String(input)).searchParams.get("wait") ?? "");
      return globalThis.fetch(input, init);
    } });
    const created = await recording.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "slow", duration_s: 120 }, maxCredits: 5 });
    asked.length = 0;
    const job = await recording.jobs.wait(created.id, { timeoutMs: 700 });
    assert.ok(!["succeeded", "failed", "cancelled", "expired"].includes(job.status), job.status);
    const first = Number(asked[0]);
    assert.ok(first > 0 && first <= 0.7, `the first poll asked ?wait=${asked[0]}`);  // was 1 (whole seconds)
    await client.jobs.cancel(created.id);
  });

  test("a NaN or Infinity in the input is refused before anything is sent", async () => {
    let sent = 0;
    const counting = new Client({ baseUrl: lc.base_url, apiKey: lc.api_key, fetch: async (input, init) => {
      sent += 1;
      return globalThis.fetch(input, init);
    } });
    for (const bad of [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY]) {
      await assert.rejects(counting.jobs.create({ provider: "sim", model: "image-fast", input: { deep: { v: bad } },
        maxCredits: 5 }), (err: unknown) => err instanceof RangeError && /"v" is .*JSON has no NaN or Infinity/
        .test(err.message));
    }
    assert.equal(sent, 0);  // JSON.stringify would have sent null: a paid job from an input nobody wrote
  });

  test("wait returns the job unfinished once its timeout passes", { timeout: 60_000 }, async () => {
    const created = await client.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "slow", duration_s: 120 }, maxCredits: 5 });
    const started = Date.now();
    const job = await client.jobs.wait(created.id, { timeoutMs: 2_000 });
    const tookMs = Date.now() - started;
    assert.equal(job.id, created.id);
    assert.ok(!["succeeded", "failed", "cancelled", "expired"].includes(job.status), job.status);
    // At least the timeout; at most the timeout, the last second's poll and a loaded machine's slack.
    assert.ok(tookMs >= 1_900, `returned after ${tookMs} ms`);
    assert.ok(tookMs < 20_000, `returned after ${tookMs} ms`);
    await client.jobs.cancel(created.id);
  });

  test("cancel refunds in full; a second cancel is InvalidStateError", { timeout: 30_000 }, async () => {
    const created = await client.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "to cancel", duration_s: 120 }, maxCredits: 7 });
    const cancelled = await client.jobs.cancel(created.id);
    assert.equal(cancelled.status, "cancelled");
    assert.deepEqual(cancelled.credits, { reserved: 7, charged: 0, refunded: 7 });
    assert.equal((await client.jobs.get(created.id)).status, "cancelled");
    await rejectsWith(client.jobs.cancel(created.id), InvalidStateError, "invalid_state", 409);
  });

  test("list: newest first, by status, page by page with next_cursor", { timeout: 30_000 }, async () => {
    const a = await client.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "list a", duration_s: 120 }, maxCredits: 1 });
    const b = await client.jobs.create({ provider: "sim", model: "image-fast",
      input: { prompt: "list b", duration_s: 120 }, maxCredits: 1 });
    await client.jobs.cancel(a.id);
    await client.jobs.cancel(b.id);

    const first = await client.jobs.list({ limit: 1 });
    assert.equal(first.jobs.length, 1);
    assert.equal(first.jobs[0]!.id, b.id);
    assert.ok(first.next_cursor);
    const second = await client.jobs.list({ limit: 1, cursor: first.next_cursor });
    assert.equal(second.jobs[0]!.id, a.id);

    const seen: string[] = [];
    for (let cursor: string | null = null; ;) {
      const page: { jobs: Job[]; next_cursor: string | null } = await client.jobs.list({ limit: 2, cursor });
      seen.push(...page.jobs.map((j) => j.id));
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    assert.equal(new Set(seen).size, seen.length);
    assert.ok(seen.includes(a.id) && seen.includes(b.id));

    const cancelled = await client.jobs.list({ status: "cancelled", limit: 100 });
    assert.ok(cancelled.jobs.length >= 2);
    assert.ok(cancelled.jobs.every((j) => j.status === "cancelled"));
    assert.equal((await client.jobs.list({ status: "expired" })).jobs.length, 0);
  });

  test("the same idempotency key gives back the same job, once", { timeout: 30_000 }, async () => {
    const key = `ts-${randomUUID()}`;
    const params = { provider: "sim", model: "image-fast", input: { prompt: "once", duration_s: 120 },
      maxCredits: 3, idempotencyKey: key };
    const before = await client.account.get();
    const one = await client.jobs.create(params);
    const two = await client.jobs.create(params);
    assert.equal(two.id, one.id);
    const afterBoth = await client.account.get();
    assert.equal(afterBoth.credits.reserved - before.credits.reserved, 3, "reserved once, not twice");
    await rejectsWith(client.jobs.create({ ...params, input: { prompt: "other" } }), IdempotencyConflictError,
      "idempotency_conflict", 409);
    await client.jobs.cancel(one.id);
  });

  test("a key that is not 1 to 255 printable ASCII characters is refused before anything is sent", async () => {
    const before = await client.account.get();
    for (const key of ["clé", "", "   ", "a\nb", "k".repeat(256)]) {
      await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: 1, idempotencyKey: key }), InvalidRequestError,
        "invalid_request", 0);
    }
    assert.deepEqual(await client.account.get(), before);
  });

  test("get with wait: sent as ?wait=N (the server refuses more than 30)", async () => {
    const created = await client.jobs.create(slowJob("get-wait-sent"));
    try {
      await rejectsWith(client.jobs.get(created.id, { wait: 31 }), InvalidRequestError, "invalid_request", 400);
      for (const wait of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
        assert.throws(() => client.jobs.get(created.id, { wait }), TypeError);
      }
      assert.equal((await client.jobs.get(created.id, { wait: 0 })).id, created.id);
    } finally {
      await client.jobs.cancel(created.id);
    }
  });

  test("get with wait: the long poll's answer may come after the request timeout, grown by the wait",
    { timeout: 60_000 }, async () => {
      const created = await client.jobs.create(slowJob("get-wait-timeout"));
      // The proxy answers no sooner than 12 s (a long poll that ran its whole wait); the client's own
      // timeout is 8 s: only 8 s + the wait (20 s) lets the answer through, 8 s of slack for a loaded machine.
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-held", ms: 12_000 }]);
      try {
        await untilRunning(created.id);
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, timeoutMs: 8_000 });
        const started = Date.now();
        const job = await via.jobs.get(created.id, { wait: 12 });
        assert.equal(job.id, created.id);
        assert.ok(Date.now() - started >= 11_500, `answered after ${Date.now() - started} ms`);
        assert.equal(proxy.seen.length, 1, "one request: none timed out and was sent again");
        assert.equal(new URL(proxy.seen[0]!.url, proxy.url).searchParams.get("wait"), "12");
        assert.equal(proxy.seen[0]!.answer?.status, 200);
      } finally {
        await proxy.close();
        await client.jobs.cancel(created.id);
      }
    });

  test("an id of \".\" or \"..\" is refused before anything is sent: fetch would resolve it to another route",
    async () => {
      const ok = { kind: "answer" as const, status: 200, body: "{}" };
      const proxy = await startProxy(lc.base_url, Array.from({ length: 10 }, () => ({ ...ok })));
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
        const calls = [() => via.jobs.cancel(".."), () => via.jobs.events(".."), () => via.jobs.get("."),
          () => via.jobs.download("..", 0), () => via.webhookEndpoints.delete(".."),
          () => via.notifications.redeliver("."), () => via.owners.grant("..", 1), () => via.owners.get("..")];
        for (const call of calls) {
          await assert.rejects(async () => call(), (err: unknown) => err instanceof TypeError && /"\." or "\.\."/
            .test(err.message));
        }
        // (Before: POST /v1/cancel, GET /v1/events, GET /v1/jobs/, ... on the wire.)
        assert.deepEqual(proxy.seen.map((r) => `${r.method} ${r.url}`), []);
        // Dots within an id, or more than two, are no dot segment: sent as they are, to the documented route.
        await via.jobs.cancel("...");
        await via.jobs.get("a..b");
        assert.deepEqual(proxy.seen.map((r) => `${r.method} ${r.url}`),
          ["POST /v1/jobs/.../cancel", "GET /v1/jobs/a..b"]);
      } finally {
        await proxy.close();
      }
      await rejectsWith(client.jobs.cancel("..."), NotFoundError, "not_found", 404);
    });
});

describe("errors", () => {
  test("a bad API key is UnauthenticatedError, and the key is in no message", async () => {
    const badKey = `lc_${"x".repeat(40)}`;
    const bad = new Client({ baseUrl: lc.base_url, apiKey: badKey });
    const calls = [() => bad.account.get(), () => bad.jobs.list(), () => bad.jobs.get(MISSING_JOB),
      () => bad.jobs.create({ ...QUICK_JOB, maxCredits: 1 })];
    for (const call of calls) {
      const err = await rejectsWith(call(), UnauthenticatedError, "unauthenticated", 401);
      assert.ok(!err.message.includes(badKey));
    }
  });

  test("a bad body is InvalidRequestError", async () => {
    await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: 0 }), InvalidRequestError,
      "invalid_request", 400);
    await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: 1.5 }), InvalidRequestError,
      "invalid_request", 400);
    await rejectsWith(client.jobs.create({ ...QUICK_JOB, input: "text" as unknown as Record<string, unknown>,
      maxCredits: 1 }), InvalidRequestError, "invalid_request", 400);
    await rejectsWith(client.jobs.list({ limit: 1000 }), InvalidRequestError, "invalid_request", 400);
  });

  test("more credits than the balance is InsufficientCreditsError", async () => {
    await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: CREDITS * 10 }), InsufficientCreditsError,
      "insufficient_credits", 402);
  });

  test("an unknown provider is UnknownProviderError; a missing job NotFoundError", async () => {
    await rejectsWith(client.jobs.create({ ...QUICK_JOB, provider: "nope", maxCredits: 1 }), UnknownProviderError,
      "unknown_provider", 422);
    await rejectsWith(client.jobs.get(MISSING_JOB), NotFoundError, "not_found", 404);
    await rejectsWith(client.jobs.cancel(MISSING_JOB), NotFoundError, "not_found", 404);
    await rejectsWith(client.jobs.download(MISSING_JOB, 0), NotFoundError, "not_found", 404);
  });

  test("no server is ConnectionError with status 0, after the bounded retries", { timeout: 30_000 }, async () => {
    const proxy = await startProxy(lc.base_url, []);
    const deadUrl = proxy.url;
    await proxy.close(); // the port is now closed: connections are refused
    const dead = new Client({ baseUrl: deadUrl, apiKey: lc.api_key, maxRetries: 2 });
    const started = Date.now();
    await rejectsWith(dead.account.get(), ConnectionError, "connection_error", 0);
    // Two retries with 0.5 s and 1 s of backoff.
    assert.ok(Date.now() - started >= 1_400);
  });

  test("an API key with a control character, a space or a non-ASCII character is refused at once, unquoted",
    async () => {
      const key = lc.api_key;
      for (const bad of [`${key}\nX`, `${key}\u0000`, `${key}\u007f`, `${key}\r\nX-Evil: 1`, `ab ${key}`,
        `\u201c${key}\u201d`, `${key}\u00e9`, " \n "]) {
        let thrown: unknown;
        try {
          new Client({ baseUrl: lc.base_url, apiKey: bad });
        } catch (err) {
          thrown = err;
        }
        // Before: accepted, then every call a ConnectionError whose cause quoted the key.
        assert.ok(thrown instanceof TypeError, `${JSON.stringify(bad.slice(-3))}: ${String(thrown)}`);
        assert.match(thrown.message, /apiKey/);
        assert.ok(!inspect(thrown).includes(key), "the key is not in the error, nor in what a logger prints");
      }
      // Whitespace around the key (a file's final newline) is trimmed: the key works.
      const padded = new Client({ baseUrl: lc.base_url, apiKey: ` ${key}\n` });
      assert.equal((await padded.account.get()).owner_id, lc.owner_id);
    });

  test("no error's message or cause holds the API key, whatever the network stack quotes", async () => {
    const key = lc.api_key;
    // A network stack that echoes the request's headers in its error, as fetch does for a header it refuses.
    const echoing = new Client({ baseUrl: lc.base_url, apiKey: key, maxRetries: 0, fetch: async (input, init) => {
      await globalThis.fetch(input, init);
      const headers = JSON.stringify(init?.headers);
      throw new TypeError("fetch failed", { cause: new AggregateError([new Error(`could not send ${headers}`)],
        `Headers.append: "Bearer ${key}" is an invalid header value`) });
    } });
    for (const call of [() => echoing.account.get(), () => echoing.jobs.create({ ...QUICK_JOB, maxCredits: 1 })]) {
      const err = await rejectsWith(call(), ConnectionError, "connection_error", 0);
      assert.ok(!inspect(err, { depth: 10 }).includes(key), "the key is not in what a logger prints");
      assert.match(String((err.cause as Error).message), /\[api key\]/);
    }
  });
});

describe("account and models", () => {
  test("account: granted = balance + reserved + charged", async () => {
    const account = await client.account.get();
    assert.equal(account.owner_id, lc.owner_id);
    const { balance, reserved, charged } = account.credits;
    assert.equal(balance + reserved + charged, CREDITS);
    assert.equal(account.max_active, 10);
    assert.ok(account.active >= 0);
  });

  test("models.list answers the models file's entries (none here)", async () => {
    assert.deepEqual(await client.models.list(), { models: [] });
  });
});

describe("retries of create, through a proxy that fails on purpose", () => {
  test("a 503 and a 429 with Retry-After are retried with the same key", { timeout: 30_000 }, async () => {
    await createsOnceAfter([
      { kind: "answer", status: 503, headers: { "Retry-After": "0" },
        body: JSON.stringify({ error: { code: "unavailable", message: "the database is unavailable" } }) },
      { kind: "answer", status: 429, headers: { "Retry-After": "1" },
        body: JSON.stringify({ error: { code: "capacity_exhausted", message: "busy" } }) },
    ]);
  });

  test("an answer lost after the job was created: the retry gets the same job", { timeout: 30_000 }, async () => {
    const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-drop" }]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
      const job = await via.jobs.create({ ...QUICK_JOB, maxCredits: 2 });
      assert.equal(proxy.seen.length, 2);
      const [lost, retried] = proxy.seen;
      assert.equal(lost!.answer?.status, 202, "the first attempt created the job");
      assert.equal(retried!.answer?.status, 200, "the retry was answered as a replay");
      assert.equal(lost!.headers["idempotency-key"], retried!.headers["idempotency-key"]);
      assert.equal(JSON.parse(lost!.answer!.body).id, job.id);
    } finally {
      await proxy.close();
    }
  });

  test("an answer cut mid-body after the job was created: the retry, same key, gets the same job",
    { timeout: 30_000 }, async () => {
      const mark = `cut-body-${randomUUID()}`;
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-cut-body" }]);
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
        const job = await via.jobs.create(slowJob(mark));  // before: TypeError: terminated
        assert.equal(proxy.seen.length, 2);
        const [cut, retried] = proxy.seen;
        assert.equal(cut!.answer?.status, 202, "the first attempt created the job");
        assert.ok(cut!.partial, "its headers and half its body went out");
        assert.equal(retried!.answer?.status, 200, "the retry was answered as a replay");
        assert.equal(cut!.headers["idempotency-key"], retried!.headers["idempotency-key"]);
        assert.equal(JSON.parse(cut!.answer!.body).id, job.id);
        assert.deepEqual(await jobsMarked(mark), [job.id], "one job");
      } finally {
        await proxy.close();
        await cancelAll(await jobsMarked(mark));
      }
    });

  test("an answer whose body stalls past the client's timeout: the retry, same key, gets the same job",
    { timeout: 60_000 }, async () => {
      const mark = `stall-body-${randomUUID()}`;
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-stall-body" }]);
      try {
        // The stalled body never ends: the 5 s timeout fires whatever the machine's speed.
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, timeoutMs: 5_000 });
        const job = await via.jobs.create(slowJob(mark));  // before: a TimeoutError, not retried
        assert.equal(proxy.seen.length, 2);
        const [stalled, retried] = proxy.seen;
        assert.equal(stalled!.answer?.status, 202);
        assert.ok(stalled!.partial);
        assert.equal(retried!.answer?.status, 200);
        assert.equal(stalled!.headers["idempotency-key"], retried!.headers["idempotency-key"]);
        assert.deepEqual(await jobsMarked(mark), [job.id], "one job");
      } finally {
        await proxy.close();
        await cancelAll(await jobsMarked(mark));
      }
    });

  test("once the retries run out the error carries the idempotency key: sent again with it, the same job",
    { timeout: 30_000 }, async () => {
      const mark = `exhausted-${randomUUID()}`;
      // The server creates the job; neither answer reaches the client.
      const proxy = await startProxy(lc.base_url, [{ kind: "forward-then-drop" }, { kind: "forward-then-drop" }]);
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 1 });
        const err = await rejectsWith(via.jobs.create(slowJob(mark)), ConnectionError, "connection_error", 0);
        const keys = proxy.seen.map((r) => r.headers["idempotency-key"]);
        assert.equal(keys.length, 2);
        assert.equal(keys[1], keys[0]);
        assert.equal(err.idempotencyKey, keys[0], "the generated key, on the error");  // before: undefined
        const first = JSON.parse(proxy.seen[0]!.answer!.body) as Job;
        const again = await client.jobs.create({ ...slowJob(mark), idempotencyKey: err.idempotencyKey! });
        assert.equal(again.id, first.id, "the caller's retry got the job the server made");
        assert.deepEqual(await jobsMarked(mark), [first.id], "one job");
      } finally {
        await proxy.close();
        await cancelAll(await jobsMarked(mark));
      }
      // Every error of a call sending a key carries it (the caller's own, or the generated one); a read's none.
      const mine = `ts-${randomUUID()}`;
      const refused = await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: CREDITS * 10,
        idempotencyKey: mine }), InsufficientCreditsError, "insufficient_credits", 402);
      assert.equal(refused.idempotencyKey, mine);
      const generated = await rejectsWith(client.jobs.create({ ...QUICK_JOB, maxCredits: 0 }), InvalidRequestError,
        "invalid_request", 400);
      assert.match(generated.idempotencyKey ?? "", /^[0-9a-f-]{36}$/);
      const read = await rejectsWith(client.jobs.get(MISSING_JOB), NotFoundError, "not_found", 404);
      assert.equal(read.idempotencyKey, undefined);
    });

  test("a 429 without Retry-After, and any 4xx, is not retried", { timeout: 30_000 }, async () => {
    const proxy = await startProxy(lc.base_url, [
      { kind: "answer", status: 429, body: JSON.stringify({ error: { code: "capacity_exhausted", message: "busy" } }) },
    ]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
      const err = await rejectsWith(via.jobs.create({ ...QUICK_JOB, maxCredits: 2 }), LongcallError,
        "capacity_exhausted", 429);
      assert.equal(err.retryAfter, undefined);
      await rejectsWith(via.jobs.create({ ...QUICK_JOB, maxCredits: 0 }), InvalidRequestError, "invalid_request", 400);
      assert.equal(proxy.seen.length, 2);
    } finally {
      await proxy.close();
    }
  });

  test("owner: the client's default, or each call's, goes out as Longcall-Owner", async () => {
    // Answered by the proxy itself: this checks what the client sends, whatever this server's owners are.
    const ok = { kind: "answer" as const, status: 200, body: "{}" };
    const proxy = await startProxy(lc.base_url, Array.from({ length: 6 }, () => ({ ...ok })));
    try {
      const platform = `own_${"a".repeat(24)}`;
      const other = `own_${"b".repeat(24)}`;
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, owner: platform });
      await via.jobs.list();
      await via.account.get({ owner: other });
      await via.jobs.create({ ...QUICK_JOB, maxCredits: 1, owner: other });
      await via.jobs.get(MISSING_JOB);
      await via.notifications.list({ owner: other });
      await new Client({ baseUrl: proxy.url, apiKey: lc.api_key }).models.list();
      assert.deepEqual(proxy.seen.map((r) => r.headers["longcall-owner"]),
        [platform, other, other, platform, other, undefined]);
      assert.ok(proxy.seen.every((r) => r.headers.authorization === `Bearer ${lc.api_key}`));
    } finally {
      await proxy.close();
    }
  });

  test("a redirect on an API call is an error, never followed with the key", { timeout: 30_000 }, async () => {
    const stolen = `${receiver.origin}/stolen`;
    const proxy = await startProxy(lc.base_url, [{ kind: "answer", status: 302, headers: { Location: stolen } },
      { kind: "answer", status: 307, headers: { Location: stolen } }]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
      const before = receiver.received.length;
      const err = await rejectsWith(via.account.get(), LongcallError, "unexpected_response", 302);
      assert.match(err.message, /redirect/);
      await rejectsWith(via.jobs.create({ ...QUICK_JOB, maxCredits: 1 }), LongcallError, "unexpected_response", 307);
      assert.equal(receiver.received.length, before, "nothing reached the redirect's target");
    } finally {
      await proxy.close();
    }
  });

  test("a gateway's 502 (an HTML page) and 504 are retried with the same key", { timeout: 30_000 }, async () => {
    await createsOnceAfter([
      { kind: "answer", status: 502, headers: { "Content-Type": "text/html" }, body: "<html>Bad Gateway</html>" },
      { kind: "answer", status: 504, headers: { "Content-Type": "text/html" }, body: "<html>Gateway Timeout</html>" },
    ]);
  });

  test("a Retry-After over a minute is thrown at once, never asked again early", { timeout: 30_000 }, async () => {
    const proxy = await startProxy(lc.base_url, [
      { kind: "answer", status: 503, headers: { "Retry-After": "120" },
        body: JSON.stringify({ error: { code: "unavailable", message: "the database is unavailable" } }) },
    ]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key });
      const err = await rejectsWith(via.account.get(), LongcallError, "unavailable", 503);
      assert.equal(err.retryAfter, 120);
      assert.equal(proxy.seen.length, 1);
    } finally {
      await proxy.close();
    }
  });

  test("an error's Retry-After is kept on the error once retries run out", { timeout: 30_000 }, async () => {
    const busy = { kind: "answer" as const, status: 503, headers: { "Retry-After": "0" },
      body: JSON.stringify({ error: { code: "unavailable", message: "the database is unavailable" } }) };
    const proxy = await startProxy(lc.base_url, [busy, busy]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 1 });
      const err = await rejectsWith(via.account.get(), LongcallError, "unavailable", 503);
      assert.equal(err.constructor.name, "UnavailableError");
      assert.equal(err.retryAfter, 0);
      assert.equal(proxy.seen.length, 2);
    } finally {
      await proxy.close();
    }
  });
});

describe("wait through an outage (a proxy in front of the server)", () => {
  const unavailable = JSON.stringify({ error: { code: "unavailable", message: "the database is unavailable" } });
  const busy = JSON.stringify({ error: { code: "capacity_exhausted", message: "busy" } });
  const internal = JSON.stringify({ error: { code: "internal", message: "a bug" } });

  test("no connection, a 503, a gateway's 502/504, a 500, a 429: waited out, and the job returned",
    { timeout: 90_000 }, async () => {
      const created = await client.jobs.create({ ...QUICK_JOB, maxCredits: 2 });
      // maxRetries 1: each poll tries twice, then the wait has the error. Each of these polls fails.
      const failures: Action[] = [
        { kind: "drop" }, { kind: "drop" },
        { kind: "answer", status: 503, headers: { "Retry-After": "0" }, body: unavailable },
        { kind: "answer", status: 503, headers: { "Retry-After": "0" }, body: unavailable },
        { kind: "answer", status: 502, headers: { "Content-Type": "text/html" }, body: "<html>Bad Gateway</html>" },
        { kind: "answer", status: 502, headers: { "Content-Type": "text/html" }, body: "<html>Bad Gateway</html>" },
        { kind: "answer", status: 429, body: busy },
        { kind: "answer", status: 500, headers: { "Content-Type": "text/html" }, body: "<html>oops</html>" },
        { kind: "answer", status: 500, body: internal },
        { kind: "answer", status: 504, body: "" }, { kind: "answer", status: 504, body: "" },
      ];
      const count = failures.length;
      const proxy = await startProxy(lc.base_url, failures);
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 1 });
        const job = await via.jobs.wait(created.id, { timeoutMs: 60_000 });  // before: ConnectionError at once
        assert.equal(job.status, "succeeded");
        assert.ok(proxy.seen.length > count, `every failure was met, then the server answered (${proxy.seen.length})`);
        assert.ok(proxy.seen.every((r) => r.url.startsWith(`/v1/jobs/${created.id}`)));
      } finally {
        await proxy.close();
      }
    });

  test("an outage until the deadline: the last job seen is returned", { timeout: 60_000 }, async () => {
    const created = await client.jobs.create(slowJob("outage-to-deadline"));
    const seenJob = await client.jobs.get(created.id);
    // The first poll is answered (the job as the server has it), then no connection ever again.
    const proxy = await startProxy(lc.base_url, [{ kind: "answer", status: 200, body: JSON.stringify(seenJob) },
      ...Array.from({ length: 200 }, () => ({ kind: "drop" as const }))]);
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 0 });
      const started = Date.now();
      const job = await via.jobs.wait(created.id, { timeoutMs: 4_000 });  // before: ConnectionError
      assert.deepEqual(job, seenJob);
      assert.ok(Date.now() - started >= 3_900, `returned after ${Date.now() - started} ms`);
      assert.ok(proxy.seen.length >= 3, `polled again after the failures (${proxy.seen.length})`);
    } finally {
      await proxy.close();
      await client.jobs.cancel(created.id);
    }
  });

  test("no poll ever answered: the last error, at the deadline; a 404 or 401 at once", { timeout: 60_000 },
    async () => {
      const created = await client.jobs.create(slowJob("outage-no-answer"));
      const proxy = await startProxy(lc.base_url, Array.from({ length: 200 }, () => ({ kind: "answer" as const,
        status: 503, headers: { "Retry-After": "1" }, body: unavailable })));
      try {
        const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 0 });
        const started = Date.now();
        await rejectsWith(via.jobs.wait(created.id, { timeoutMs: 3_000 }), UnavailableError, "unavailable", 503);
        const tookMs = Date.now() - started;
        assert.ok(tookMs >= 2_900, `thrown after ${tookMs} ms`);  // before: at the first 503
        assert.ok(proxy.seen.length >= 2);
      } finally {
        await proxy.close();
        await client.jobs.cancel(created.id);
      }
      const started = Date.now();
      await rejectsWith(client.jobs.wait(MISSING_JOB, { timeoutMs: 60_000 }), NotFoundError, "not_found", 404);
      const stranger = new Client({ baseUrl: lc.base_url, apiKey: `lc_${"x".repeat(40)}` });
      await rejectsWith(stranger.jobs.wait(created.id, { timeoutMs: 60_000 }), UnauthenticatedError,
        "unauthenticated", 401);
      assert.ok(Date.now() - started < 30_000, "not waited on");
    });

  test("a caller's abort ends a wait's pause at once", { timeout: 30_000 }, async () => {
    const proxy = await startProxy(lc.base_url, Array.from({ length: 50 }, () => ({ kind: "answer" as const,
      status: 503, headers: { "Retry-After": "30" }, body: unavailable })));
    try {
      const via = new Client({ baseUrl: proxy.url, apiKey: lc.api_key, maxRetries: 0 });
      const controller = new AbortController();
      const started = Date.now();
      setTimeout(() => controller.abort(new Error("stop")), 500);
      await assert.rejects(via.jobs.wait(MISSING_JOB, { timeoutMs: 60_000, signal: controller.signal }), /stop/);
      assert.ok(Date.now() - started < 20_000, `aborted after ${Date.now() - started} ms`);
    } finally {
      await proxy.close();
    }
  });
});

describe("events and notifications", () => {
  test("events: the job's timeline, oldest first", { timeout: 60_000 }, async () => {
    const created = await client.jobs.create({ ...QUICK_JOB, maxCredits: 4, metadata: { t: "events" } });
    const job = await client.jobs.wait(created.id, { timeoutMs: 45_000 });
    assert.equal(job.status, "succeeded");
    const { events } = await client.jobs.events(job.id);
    const types = events.map((e) => e.type);
    assert.equal(types[0], "created");
    assert.ok(types.includes("closed"), types.join(","));
    assert.ok(types.includes("output_stored"), types.join(","));
    const times = events.map((e) => Date.parse(e.at));
    assert.deepEqual(times, [...times].sort((x, y) => x - y));
    await rejectsWith(client.jobs.events(MISSING_JOB), NotFoundError, "not_found", 404);
  });

  test("an endpoint gets the job's notification, signed: verifyWebhook accepts it; redeliver; delete",
    { timeout: 90_000 }, async () => {
      const endpoint = await client.webhookEndpoints.create({ url: `${receiver.origin}/hooks`,
        events: ["job.succeeded"] });
      assert.match(endpoint.id, /^we_/);
      assert.match(endpoint.secret, /^whsec_/);
      assert.deepEqual(endpoint.events, ["job.succeeded"]);
      const listed = await client.webhookEndpoints.list();
      const mine = listed.webhook_endpoints.find((e) => e.id === endpoint.id);
      assert.ok(mine);
      assert.equal(mine.url, endpoint.url);
      assert.ok(!("secret" in mine), "no secret in the list");
      let eventId = "";

      try {
        const job = await client.jobs.wait((await client.jobs.create({ ...QUICK_JOB, maxCredits: 4 })).id,
          { timeoutMs: 45_000 });
        assert.equal(job.status, "succeeded");
        const forJob = (r: { body: Buffer }) => r.body.includes(job.id);
        const delivery = await receiver.next(forJob, 45_000);
        const event = verifyWebhook<NotificationPayload>(delivery.headers, delivery.body, endpoint.secret);
        eventId = event.id;
        assert.equal(event.type, "job.succeeded");
        assert.equal(event.data.id, job.id);
        assert.equal(event.data.status, "succeeded");
        assert.equal(delivery.headers["webhook-id"], event.id);
        assert.throws(() => verifyWebhook(delivery.headers, delivery.body, `whsec_${"A".repeat(32)}`));

        // Delivered: the notification says so (the settler records it just after the 204).
        let notification;
        for (const deadline = Date.now() + 30_000; Date.now() < deadline;) {
          const { notifications } = await client.notifications.list({ jobId: job.id });
          notification = notifications.find((n) => n.id === event.id);
          if (notification?.deliveries.every((d) => d.status === "delivered")) break;
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
        assert.ok(notification, "the notification is listed");
        assert.equal(notification.type, "job.succeeded");
        assert.equal(notification.job_id, job.id);
        assert.deepEqual(notification.deliveries.map((d) => [d.endpoint_id, d.status]),
          [[endpoint.id, "delivered"]]);

        const before = receiver.received.length;
        const again = await client.notifications.redeliver(event.id);
        assert.equal(again.id, event.id);
        assert.deepEqual(again.deliveries.map((d) => d.endpoint_id), [endpoint.id]);
        const redelivered = await receiver.next((r) => forJob(r) && receiver.received.indexOf(r) >= before, 45_000);
        assert.equal(redelivered.headers["webhook-id"], event.id, "the same webhook-id on a redelivery");
        assert.equal(verifyWebhook<NotificationPayload>(redelivered.headers, redelivered.body, endpoint.secret).id,
          event.id);
      } finally {
        await client.webhookEndpoints.delete(endpoint.id);
      }
      assert.ok(!(await client.webhookEndpoints.list()).webhook_endpoints.some((e) => e.id === endpoint.id));
      await rejectsWith(client.webhookEndpoints.delete(endpoint.id), NotFoundError, "not_found", 404);
      // Its only endpoint is gone: nothing to send again.
      await rejectsWith(client.notifications.redeliver(eventId), InvalidStateError, "invalid_state", 409);
      await rejectsWith(client.notifications.redeliver("evt_0123456789abcdef01234567"), NotFoundError,
        "not_found", 404);
    });

  test("an endpoint on a private address is refused: InvalidRequestError", async () => {
    await rejectsWith(client.webhookEndpoints.create({ url: "https://10.0.0.1/hooks" }), InvalidRequestError,
      "invalid_request", 400);
    await rejectsWith(client.webhookEndpoints.create({ url: `${receiver.origin}/hooks`, events: ["job.nope" as never] }),
      InvalidRequestError, "invalid_request", 400);
  });
});
