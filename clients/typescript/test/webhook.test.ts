// verifyWebhook against signatures made by the reference Python library (standardwebhooks), so both
// sides of the check are not ours.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { before, describe, test } from "node:test";

import { type NotificationPayload, WebhookVerificationError, verifyWebhook } from "longcall-client";

import { runPython } from "./support/python.js";

const SIGN = `
import json, sys
from datetime import datetime, timezone
from standardwebhooks import Webhook
v = json.load(sys.stdin)
at = datetime.fromtimestamp(v["timestamp"], tz=timezone.utc)
print(json.dumps({name: Webhook(secret).sign(v["msg_id"], at, v["payload"])
                  for name, secret in v["secrets"].items()}))
`;

const secret = `whsec_${randomBytes(24).toString("base64")}`;
const otherSecret = `whsec_${randomBytes(32).toString("base64")}`;
const msgId = "evt_0123456789abcdef01234567";
const timestamp = 1_767_225_600; // fixed; each check passes `now` explicitly
const payloadObject: NotificationPayload = {
  id: msgId,
  type: "job.succeeded",
  created_at: "2026-01-01T00:00:00Z",
  // Non-ASCII on purpose: the signature is over the UTF-8 bytes.
  data: { id: "job_0123456789abcdef01234567", metadata: { note: "café ☕ — ünïcode" } } as never,
};
const payload = JSON.stringify(payloadObject);
let signature = "";
let otherSignature = "";

function headers(overrides: Record<string, string> = {}): Record<string, string> {
  return { "webhook-id": msgId, "webhook-timestamp": String(timestamp), "webhook-signature": signature, ...overrides };
}

function refuses(run: () => unknown, message: RegExp) {
  assert.throws(run, (err: unknown) => {
    assert.ok(err instanceof WebhookVerificationError, `expected WebhookVerificationError, got ${String(err)}`);
    assert.match(err.message, message);
    assert.ok(!err.message.includes(secret.slice(6)));
    return true;
  });
}

before(async () => {
  const out = await runPython(SIGN, JSON.stringify({ msg_id: msgId, timestamp, payload,
    secrets: { ours: secret, other: otherSecret } }));
  ({ ours: signature, other: otherSignature } = JSON.parse(out) as { ours: string; other: string });
  assert.match(signature, /^v1,[A-Za-z0-9+/]+=*$/);
}, { timeout: 60_000 });

describe("verifyWebhook accepts what standardwebhooks signs", () => {
  test("a plain record of headers, the body as a string: the parsed body", () => {
    assert.deepEqual(verifyWebhook(headers(), payload, secret, { now: timestamp }), payloadObject);
  });

  test("header names in any case; a Headers object; the body as bytes", () => {
    const mixed = { "Webhook-Id": msgId, "WEBHOOK-TIMESTAMP": String(timestamp), "Webhook-Signature": signature };
    assert.deepEqual(verifyWebhook(mixed, payload, secret, { now: timestamp }), payloadObject);
    const bytes = new TextEncoder().encode(payload);
    assert.deepEqual(verifyWebhook(new Headers(headers()), bytes, secret, { now: timestamp }), payloadObject);
    // A view into a larger buffer (as Buffer pools give): only its own bytes count.
    const padded = Buffer.concat([Buffer.from("xx"), Buffer.from(payload), Buffer.from("yy")]);
    assert.deepEqual(verifyWebhook(headers(), padded.subarray(2, padded.length - 2), secret, { now: timestamp }),
      payloadObject);
  });

  test("several signatures (a secret being rotated): one match is enough", () => {
    const both = headers({ "webhook-signature": `${otherSignature} ${signature}` });
    assert.deepEqual(verifyWebhook(both, payload, secret, { now: timestamp }), payloadObject);
    assert.deepEqual(verifyWebhook(both, payload, otherSecret, { now: timestamp }), payloadObject);
  });

  test("inside the tolerance either way, `now` as a Date or seconds", () => {
    verifyWebhook(headers(), payload, secret, { now: timestamp + 300 });
    verifyWebhook(headers(), payload, secret, { now: timestamp - 300 });
    verifyWebhook(headers(), payload, secret, { now: new Date((timestamp + 299) * 1000) });
    verifyWebhook(headers(), payload, secret, { now: timestamp + 3000, toleranceS: 3600 });
  });
});

describe("verifyWebhook refuses", () => {
  const at = { now: timestamp };

  test("a tampered body", () => {
    refuses(() => verifyWebhook(headers(), payload.replace("succeeded", "failed"), secret, at), /signature/);
    refuses(() => verifyWebhook(headers(), `${payload} `, secret, at), /signature/);
  });

  test("a tampered id", () => {
    refuses(() => verifyWebhook(headers({ "webhook-id": "evt_0123456789abcdef01234568" }), payload, secret, at),
      /signature/);
  });

  test("a tampered timestamp, though inside the tolerance", () => {
    refuses(() => verifyWebhook(headers({ "webhook-timestamp": String(timestamp + 1) }), payload, secret, at),
      /signature/);
  });

  test("another secret", () => {
    refuses(() => verifyWebhook(headers(), payload, otherSecret, at), /signature/);
  });

  test("a stale or a future timestamp", () => {
    refuses(() => verifyWebhook(headers(), payload, secret, { now: timestamp + 301 }), /too old/);
    refuses(() => verifyWebhook(headers(), payload, secret, { now: timestamp - 301 }), /too new/);
    // The default is the clock: this 2026 timestamp is far from it in any test run after that year's start.
    if (Math.abs(Date.now() / 1000 - timestamp) > 300) refuses(() => verifyWebhook(headers(), payload, secret), /too/);
  });

  test("missing or malformed headers and signatures", () => {
    for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature"]) {
      const without = headers();
      delete without[name];
      refuses(() => verifyWebhook(without, payload, secret, at), /missing/);
    }
    refuses(() => verifyWebhook(headers({ "webhook-timestamp": `${timestamp}.0` }), payload, secret, at), /malformed/);
    refuses(() => verifyWebhook(headers({ "webhook-timestamp": "-1" }), payload, secret, at), /malformed/);
    const body64 = signature.slice(3);
    for (const bad of [`v2,${body64}`, body64, `v1,${body64.slice(0, -4)}`, "v1,!!!!", "v1,", ""]) {
      refuses(() => verifyWebhook(headers({ "webhook-signature": bad }), payload, secret, at), /signature|missing/);
    }
  });

  test("a signed body that is not JSON", async () => {
    const out = await runPython(SIGN, JSON.stringify({ msg_id: msgId, timestamp, payload: "not json",
      secrets: { ours: secret } }));
    const { ours } = JSON.parse(out) as { ours: string };
    refuses(() => verifyWebhook(headers({ "webhook-signature": ours }), "not json", secret, at), /not JSON/);
  });

  test("a parsed body or a malformed secret is a programming error (TypeError)", () => {
    assert.throws(() => verifyWebhook(headers(), payloadObject as never, secret, at), TypeError);
    assert.throws(() => verifyWebhook(headers(), payload, "whsec_not base64!", at), (err: unknown) =>
      err instanceof TypeError && !err.message.includes("not base64!"));
  });
});
