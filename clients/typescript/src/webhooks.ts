// verifyWebhook: Standard Webhooks (https://www.standardwebhooks.com), as longcall signs its notifications.
// The signature is HMAC-SHA256 over `${webhook-id}.${webhook-timestamp}.${raw body}`, keyed with the
// base64 after `whsec_`; `webhook-signature` lists `v1,<base64>` entries separated by spaces (several
// while a secret rotates).

import { createHmac, timingSafeEqual } from "node:crypto";

import { WebhookVerificationError } from "./errors.js";
import type { NotificationPayload } from "./types.js";

/** A fetch Headers object, or a plain record such as Node's `req.headers`. */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export interface VerifyWebhookOptions {
  /** How far the timestamp may be from now, either way; default 300 s. */
  toleranceS?: number;
  /** "Now", as a Date or Unix seconds; default the clock. */
  now?: Date | number;
}

const SECRET_PREFIX = "whsec_";
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;
const DEFAULT_TOLERANCE_S = 300;

/**
 * Checks a notification's Standard Webhooks headers against its raw body and the endpoint's secret,
 * and returns the body parsed. Throws WebhookVerificationError for a missing or malformed header, a
 * timestamp outside the tolerance, or no matching signature. `body` must be the bytes as received:
 * a body parsed and serialised again is not what was signed.
 */
export function verifyWebhook<T = NotificationPayload>(
  headers: WebhookHeaders,
  body: string | Uint8Array,
  secret: string,
  options: VerifyWebhookOptions = {},
): T {
  const key = secretKey(secret);
  const raw = bodyBytes(body);
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) throw new WebhookVerificationError("missing webhook headers");

  if (!/^\d{1,15}$/.test(timestamp)) throw new WebhookVerificationError("malformed webhook-timestamp");
  const now = nowSeconds(options.now);
  const toleranceS = options.toleranceS ?? DEFAULT_TOLERANCE_S;
  const age = now - Number(timestamp);
  if (age > toleranceS) throw new WebhookVerificationError("webhook timestamp too old");
  if (age < -toleranceS) throw new WebhookVerificationError("webhook timestamp too new");

  const expected = createHmac("sha256", key).update(`${id}.${timestamp}.`).update(raw).digest();
  if (!signatures.split(" ").some((entry) => matches(entry, expected))) {
    throw new WebhookVerificationError("no matching webhook signature");
  }
  try {
    return JSON.parse(raw.toString("utf8")) as T;
  } catch {
    throw new WebhookVerificationError("webhook body is not JSON");
  }
}

function matches(entry: string, expected: Buffer): boolean {
  const comma = entry.indexOf(",");
  if (comma < 0 || entry.slice(0, comma) !== "v1") return false;
  const encoded = entry.slice(comma + 1);
  if (!BASE64.test(encoded)) return false;
  const given = Buffer.from(encoded, "base64");
  // timingSafeEqual needs equal lengths; a length says nothing about the secret.
  return given.length === expected.length && timingSafeEqual(given, expected);
}

function secretKey(secret: string): Buffer {
  if (typeof secret !== "string") throw new TypeError("the webhook secret must be a string");
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  // Never the secret itself in the message: it is a key.
  if (!BASE64.test(encoded)) throw new TypeError("the webhook secret is not a whsec_<base64> secret");
  return Buffer.from(encoded, "base64");
}

function bodyBytes(body: string | Uint8Array): Buffer {
  if (typeof body === "string") return Buffer.from(body, "utf8");
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError("verifyWebhook needs the raw body (a string or bytes), not a parsed object");
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  for (const [key, value] of Object.entries(headers as Record<string, string | string[] | undefined>)) {
    if (key.toLowerCase() !== name) continue;
    if (Array.isArray(value)) return value.length === 1 ? value[0] : undefined; // repeated: ambiguous, refused
    return value;
  }
  return undefined;
}

function nowSeconds(now: Date | number | undefined): number {
  if (now === undefined) return Math.floor(Date.now() / 1000);
  return now instanceof Date ? Math.floor(now.getTime() / 1000) : now;
}
