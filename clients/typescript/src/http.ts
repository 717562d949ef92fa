// One HTTP exchange with longcall: headers, timeout, bounded retries, and the API's errors as exceptions.

import { ConnectionError, LongcallError, type LongcallErrorOptions, apiError } from "./errors.js";

export type FetchLike = (input: string | URL, init?: RequestInit) => Promise<Response>;

export interface TransportOptions {
  baseUrl: string;
  apiKey: string;
  owner?: string | undefined;
  fetch?: FetchLike | undefined;
  timeoutMs?: number | undefined;
  maxRetries?: number | undefined;
}

export interface Call {
  method: "GET" | "POST" | "DELETE";
  /** Path under the base URL, its parameters already encoded. */
  path: string;
  query?: Record<string, string | number | undefined | null> | undefined;
  body?: unknown;
  headers?: Record<string, string> | undefined;
  /** Sent as `Idempotency-Key`, the same on every retry; every LongcallError the call throws carries it,
   * so the caller can send the call again with it once the client's own retries have run out. */
  idempotencyKey?: string | undefined;
  owner?: string | undefined;
  /** False for the owners API: the platform's own, where the server refuses a Longcall-Owner, so neither
   * the client's default owner nor any other is sent. */
  actsForOwner?: boolean;
  /** Safe to send again: a read, or a create carrying its idempotency key. */
  retry?: boolean;
  timeoutMs?: number | undefined;
  signal?: AbortSignal | undefined;
  /** For downloads: a redirect is an answer, handed back. For every other call it is an error. */
  acceptRedirect?: boolean;
}

export const DEFAULT_TIMEOUT_MS = 60_000;
export const DEFAULT_MAX_RETRIES = 3;
// A server asking for a longer pause gets its error thrown instead: a client
// call should not hang for minutes, nor ask again before the time it was given.
export const MAX_RETRY_AFTER_S = 60;
// Backoff after a connection error or a 502/503/504 without Retry-After: 0.5 s, 1 s, 2 s, ...
const BACKOFF_BASE_S = 0.5;

/**
 * Seconds to wait before sending a call that is safe to send twice again
 * after an error answer, or undefined: throw it. A 503 (the database is away;
 * a proxy's overload) and a 429 that says when (Retry-After: the owner's
 * slots are full) are worth waiting for; a gateway's 502/504 too (the answer
 * may be lost after the server acted: the same idempotency key finds it).
 */
export function delayAfterStatus(status: number, retryAfter: number | undefined, attempt: number): number | undefined {
  if (status === 429 && retryAfter === undefined) return undefined;
  if (![429, 502, 503, 504].includes(status)) return undefined;
  if (retryAfter === undefined) return backoffS(attempt);
  return retryAfter <= MAX_RETRY_AFTER_S ? retryAfter : undefined;
}

export class Transport {
  readonly baseUrl: string;
  readonly defaultOwner: string | undefined;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly fetch: FetchLike;
  readonly #apiKey: string;

  constructor(options: TransportOptions) {
    if (!options.baseUrl) throw new TypeError("baseUrl is required");
    // Trimmed (a key read from a file keeps its newline), then checked, and the message never quotes it:
    // a key fetch refuses as a header value (an inner newline, a NUL, a character beyond ASCII) would
    // otherwise be quoted whole in fetch's error, and thrown as a connection error though nothing was sent.
    const apiKey = typeof options.apiKey === "string" ? options.apiKey.trim() : "";
    if (!apiKey) throw new TypeError("apiKey is required");
    if (!API_KEY.test(apiKey)) {
      throw new TypeError("apiKey must be printable ASCII without spaces or control characters");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#apiKey = apiKey;
    this.defaultOwner = options.owner;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.maxRetries = options.maxRetries ?? DEFAULT_MAX_RETRIES;
    // Bound late so a test or an app may replace globalThis.fetch after the client exists.
    this.fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  /** The call's JSON answer (undefined for 204). */
  async json<T>(call: Call): Promise<T> {
    const { response, text } = await this.attempts(call, true);
    if (response.status === 204) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new LongcallError("unexpected_response", `${call.method} ${call.path}: the answer is not JSON`,
        response.status, this.keyOf(call));
    }
  }

  /** The answer to a call, 2xx (or 3xx with acceptRedirect), its body not yet read (a download streams
   * it); any other answer is thrown as its error. */
  async send(call: Call): Promise<Response> {
    return (await this.attempts(call, false)).response;
  }

  /** Sends `call` until it is answered, within the retries allowed; with `readBody`, a 2xx answer's body
   * is read as part of the attempt. */
  private async attempts(call: Call, readBody: boolean): Promise<{ response: Response; text: string }> {
    const url = this.url(call);
    // Encoded once, before anything is sent: a body JSON cannot carry is the caller's error, never a retry.
    const body = call.body === undefined ? undefined : jsonBody(call.body);
    for (let attempt = 0; ; attempt++) {
      const retriesLeft = call.retry === true && attempt < this.maxRetries;
      let response: Response;
      let text = "";
      try {
        response = await this.fetch(url, this.init(call, body));
        // The body is part of the attempt: the server has acted once the headers are out, so a connection
        // cut, or the timeout firing, while the body arrives is a connection error like any other, sent
        // again with the same key. (Read outside, it was a bare TypeError, and the caller made a second job.)
        if (readBody && response.ok) text = await response.text();
      } catch (err) {
        if (call.signal?.aborted) throw call.signal.reason;
        if (!retriesLeft) throw this.connectionError(call, err);
        await sleep(backoffS(attempt), call.signal);
        continue;
      }
      if (response.ok) return { response, text };
      // (A browser hides a manual redirect: an "opaqueredirect" of status 0.)
      if (call.acceptRedirect && (isRedirect(response.status) || response.type === "opaqueredirect")) {
        return { response, text };
      }
      const retryAfter = retryAfterSeconds(response.headers.get("retry-after"));
      const delay = retriesLeft ? delayAfterStatus(response.status, retryAfter, attempt) : undefined;
      if (delay !== undefined) {
        await discard(response);
        await sleep(delay, call.signal);
        continue;
      }
      throw await this.errorOf(call, response, retryAfter);
    }
  }

  url(call: Call): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined && value !== null) params.set(name, String(value));
    }
    const query = params.toString();
    return `${this.baseUrl}${call.path}${query ? `?${query}` : ""}`;
  }

  private init(call: Call, body: string | undefined): RequestInit {
    const headers: Record<string, string> = {
      Accept: "application/json",
      Authorization: `Bearer ${this.#apiKey}`,
      ...call.headers,
    };
    const owner = call.actsForOwner === false ? undefined : call.owner ?? this.defaultOwner;
    if (owner) headers["Longcall-Owner"] = owner;
    if (call.idempotencyKey !== undefined) headers["Idempotency-Key"] = call.idempotencyKey;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const timeout = AbortSignal.timeout(call.timeoutMs ?? this.timeoutMs);
    const signal = call.signal ? AbortSignal.any([timeout, call.signal]) : timeout;
    // Never followed here: fetch would carry our headers to wherever a redirect points.
    const init: RequestInit = { method: call.method, headers, signal, redirect: "manual" };
    if (body !== undefined) init.body = body;
    return init;
  }

  private connectionError(call: Call, err: unknown): ConnectionError {
    const timedOut = err instanceof Error && err.name === "TimeoutError";
    const detail = timedOut ? `no answer within ${call.timeoutMs ?? this.timeoutMs} ms` : describe(err);
    return new ConnectionError("connection_error", this.clean(`${call.method} ${call.path}: ${detail}`), 0,
      { ...this.keyOf(call), cause: this.safeCause(err) });
  }

  /** The options that put the call's idempotency key on its errors (none for a call without one). */
  private keyOf(call: Call): LongcallErrorOptions {
    return call.idempotencyKey === undefined ? {} : { idempotencyKey: call.idempotencyKey };
  }

  private async errorOf(call: Call, response: Response, retryAfter: number | undefined): Promise<LongcallError> {
    const options: LongcallErrorOptions = retryAfter === undefined ? this.keyOf(call)
      : { ...this.keyOf(call), retryAfter };
    let parsed: unknown;
    try {
      parsed = JSON.parse(await response.text());
    } catch {
      parsed = undefined;
    }
    const error = (parsed as { error?: { code?: unknown; message?: unknown } } | undefined)?.error;
    if (error && typeof error.code === "string") {
      const message = typeof error.message === "string" ? error.message : error.code;
      return apiError(error.code, this.clean(message), response.status, options);
    }
    const hint = isRedirect(response.status) ? " (a redirect, not followed with the API key: check baseUrl)" : "";
    return new LongcallError("unexpected_response", `${call.method} ${call.path}: HTTP ${response.status}${hint}`,
      response.status, options);
  }

  /** Never let the key out in a message, whatever a server or a network stack echoes. */
  clean(message: string): string {
    return message.split(this.#apiKey).join("[api key]");
  }

  /** `err` as a cause, unless it quotes the key anywhere a logger prints (its message, stack, own fields,
   * causes): then a plain Error of its cleaned description. A checked key is not refused as a header
   * value, the one failure of fetch known to quote it, but a replaced fetch or a proxy may echo anything. */
  private safeCause(err: unknown): unknown {
    return this.quotesKey(err, 0) ? new Error(this.clean(describe(err))) : err;
  }

  private quotesKey(value: unknown, depth: number): boolean {
    if (typeof value === "string") return value.includes(this.#apiKey);
    if (typeof value !== "object" || value === null || ArrayBuffer.isView(value)) return false;
    // Deep enough for fetch's causes (an AggregateError of socket errors); a deeper, or circular, one is
    // not kept, to be sure.
    if (depth > 6) return true;
    return Reflect.ownKeys(value).some((name) => {
      let item: unknown;
      try {
        item = (value as Record<string | symbol, unknown>)[name];
      } catch {
        return false;
      }
      return this.quotesKey(item, depth + 1);
    });
  }
}

// What a key may hold: what an Authorization header can carry, as the Python client checks it.
const API_KEY = /^[\x21-\x7e]+$/;

/** Drops an answer's body unread (an errored stream rejects its cancel: nothing to do about it). */
async function discard(response: Response): Promise<void> {
  await response.body?.cancel().catch(() => undefined);
}

function isRedirect(status: number): boolean {
  return status === 301 || status === 302 || status === 303 || status === 307 || status === 308;
}

function backoffS(attempt: number): number {
  return BACKOFF_BASE_S * 2 ** attempt;
}

/** Retry-After in seconds: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export function retryAfterSeconds(value: string | null): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const at = Date.parse(text);
  return Number.isNaN(at) ? undefined : Math.max(0, (at - Date.now()) / 1000);
}

function describe(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  // Node's fetch says "fetch failed" and keeps the reason (ECONNREFUSED, ...) in `cause`.
  const cause = err.cause as { code?: unknown; message?: unknown } | undefined;
  if (cause && typeof cause.code === "string") return `${err.message} (${cause.code})`;
  if (cause && typeof cause.message === "string") return `${err.message} (${cause.message})`;
  return err.message;
}

/** Resolves after `seconds`; rejects with the signal's reason as soon as it aborts (a caller who gave up
 * does not wait out a backoff or a Retry-After). */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const aborted = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }, seconds * 1000);
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/** `value` as JSON. JSON has no NaN or Infinity: JSON.stringify would send them as null (a paid job
 * created from an input the caller did not write), so they are refused here, as the server refuses them
 * (400 invalid_request) and as the Python client does. */
export function jsonBody(value: unknown): string {
  return JSON.stringify(value, (key, item: unknown) => {
    if (typeof item === "number" && !Number.isFinite(item)) {
      throw new RangeError(`${key ? `"${key}"` : "the body"} is ${item}: JSON has no NaN or Infinity`);
    }
    return item;
  });
}
