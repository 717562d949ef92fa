// The client: one resource object per part of the API, each method one documented route.
// Methods return the API's JSON as it is (snake_case fields), typed in ./types.ts.

import { ConnectionError, InvalidRequestError, LongcallError } from "./errors.js";
import { type DownloadedOutput, writeDownload } from "./files.js";
import { type FetchLike, Transport, sleep } from "./http.js";
import type {
  Account,
  CreatedWebhookEndpoint,
  Job,
  JobEvents,
  JobList,
  JobStatus,
  ModelList,
  NotificationEventType,
  Owner,
  OwnerPage,
  Notification,
  NotificationList,
  WebhookEndpointList,
} from "./types.js";
import { isTerminal } from "./types.js";

export interface ClientOptions {
  /** The longcall server, e.g. "https://longcall.example.com". */
  baseUrl: string;
  apiKey: string;
  /** A platform key's default owner (`own_…`), sent as `Longcall-Owner` on every call. */
  owner?: string;
  /** Defaults to the global fetch. */
  fetch?: FetchLike;
  /** Per request (a long poll adds its wait to it); default 60 000. */
  timeoutMs?: number;
  /** Retries of a safe call after a connection error, a 503, or a 429 with Retry-After; default 3. */
  maxRetries?: number;
}

/** Accepted by the owners calls: the platform's own, never made for an owner. */
export interface PlatformCallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

/** Accepted by every call but the owners calls. */
export interface CallOptions extends PlatformCallOptions {
  /** Act for this owner (`Longcall-Owner`): a platform key only. Overrides the client's `owner`. */
  owner?: string;
}

export interface CreateJobParams extends CallOptions {
  provider: string;
  model: string;
  input: Record<string, unknown>;
  /** Credits reserved for the job (integer ≥ 1); the unused part is refunded. */
  maxCredits: number;
  metadata?: Record<string, unknown>;
  /** Sent as `Idempotency-Key`; a random UUID when omitted, reused by the client's own retries. */
  idempotencyKey?: string;
}

export interface GetJobOptions extends CallOptions {
  /** A long poll: the server holds the answer until the job changes or this many seconds pass (at most
   * MAX_WAIT_S, 30; to the millisecond). The request's timeout grows by it. */
  wait?: number;
}

export interface ListJobsParams extends CallOptions {
  status?: JobStatus;
  limit?: number;
  cursor?: string | null;
}

export interface WaitOptions extends CallOptions {
  /** Give up waiting after this long and return the job as it is; default 10 minutes. An outage on the
   * way (no connection, a 5xx, a 429) is waited out until then. */
  timeoutMs?: number;
}

export interface CreateWebhookEndpointParams extends CallOptions {
  url: string;
  events?: NotificationEventType[];
}

export interface ListNotificationsParams extends CallOptions {
  jobId?: string;
  limit?: number;
  cursor?: string | null;
}

export interface CreateOwnerParams extends PlatformCallOptions {
  /** 1 to 200 characters. */
  name: string;
  /** Credits granted at creation (whole number ≥ 0); the server's default is 0. */
  credits?: number;
  /** Jobs it may have unfinished at once; the server's default is 10. */
  maxActive?: number;
  /** Sent as `Idempotency-Key`; a random UUID when omitted, reused by the client's own retries. */
  idempotencyKey?: string;
}

export interface ListOwnersParams extends PlatformCallOptions {
  limit?: number;
  cursor?: string | null;
}

export interface GrantOptions extends PlatformCallOptions {
  /** Kept on the grant's ledger entry; at most 500 characters. */
  reason?: string | null;
  /** Sent as `Idempotency-Key` (the route requires one); a random UUID when omitted, reused by the
   * client's own retries, so a retried grant moves the credits once. */
  idempotencyKey?: string;
}

/** The longest `?wait=` the server holds a read (CONTRACT.md). */
export const MAX_WAIT_S = 30;

/** The `?wait=` of the next long poll with `leftMs` left: to the millisecond (the server takes
 * fractional seconds), so the last poll ends at the deadline; 0 once it has passed (read at once). */
export function pollSeconds(leftMs: number): number {
  if (!(leftMs > 0)) return 0;
  return Math.min(MAX_WAIT_S, Math.floor(leftMs) / 1000);
}

const DEFAULT_WAIT_TIMEOUT_MS = 10 * 60_000;
// A long poll answered at once without a change must not become a tight loop.
const MIN_POLL_INTERVAL_S = 0.1;
// The pause before polling again after a failed poll, when the server did not say how long (Retry-After).
const OUTAGE_PAUSE_S = 1;

export class Client {
  readonly jobs: Jobs;
  readonly account: AccountResource;
  readonly models: Models;
  readonly webhookEndpoints: WebhookEndpoints;
  readonly notifications: Notifications;
  readonly owners: Owners;

  constructor(options: ClientOptions) {
    const transport = new Transport(options);
    this.jobs = new Jobs(transport);
    this.account = new AccountResource(transport);
    this.models = new Models(transport);
    this.webhookEndpoints = new WebhookEndpoints(transport);
    this.notifications = new Notifications(transport);
    this.owners = new Owners(transport);
  }
}

function common(options: CallOptions = {}) {
  return { owner: options.owner, signal: options.signal, timeoutMs: options.timeoutMs };
}

function platformCommon(options: PlatformCallOptions) {
  return { actsForOwner: false, signal: options.signal, timeoutMs: options.timeoutMs };
}

function segment(value: string, name: string): string {
  if (typeof value !== "string" || value === "") throw new TypeError(`${name} must be a non-empty string`);
  // A "." or ".." segment is resolved away by the URL parser, and the call reaches another route
  // (jobs.cancel("..") was POST /v1/cancel). Escaping cannot help here as it does in the Python client:
  // fetch's (WHATWG) parser takes %2E and %2E%2E for dot segments too. No id of the API is one: refused.
  if (value === "." || value === "..") throw new TypeError(`${name} must not be "." or ".."`);
  return encodeURIComponent(value);
}

/** An error a wait outlives: no answer, the server or a gateway away or overloaded (500, 502, 503, 504,
 * 429), or a page not the API's in its place. The job goes on running meanwhile; a wait that gave up would
 * have its caller submit it a second time. Any other error (401, 404, ...) would only come again. */
function isOutage(err: unknown): err is LongcallError {
  if (!(err instanceof LongcallError)) return false;
  if (err instanceof ConnectionError || [429, 500, 502, 503, 504].includes(err.status)) return true;
  return err.code === "unexpected_response" && (err.status >= 500 || (err.status >= 200 && err.status < 300));
}

export class Jobs {
  constructor(private readonly http: Transport) {}

  /** POST /v1/jobs. The same key and payload give back the same job (200), never a second one. */
  async create(params: CreateJobParams): Promise<Job> {
    const body: Record<string, unknown> = {
      provider: params.provider,
      model: params.model,
      input: params.input,
      max_credits: params.maxCredits,
    };
    if (params.metadata !== undefined) body.metadata = params.metadata;
    const key = idempotencyKeyOf(params.idempotencyKey);
    return this.http.json<Job>({
      method: "POST", path: "/v1/jobs", body, idempotencyKey: key, retry: true, ...common(params),
    });
  }

  /** GET /v1/jobs/{id}: the job now; with `wait` (seconds, ≤ 30), held until the job changes or `wait`
   * passes, as the Python client's `get(job_id, wait=)`. */
  get(jobId: string, options: GetJobOptions = {}): Promise<Job> {
    const { wait } = options;
    if (wait !== undefined && !(typeof wait === "number" && Number.isFinite(wait) && wait >= 0)) {
      throw new TypeError("wait must be a number of seconds ≥ 0");
    }
    // To the millisecond, as the Python client sends it; a larger one than the server takes is its 400.
    const waitS = wait === undefined ? 0 : Math.round(wait * 1000) / 1000;
    return this.http.json<Job>({
      method: "GET", path: `/v1/jobs/${segment(jobId, "jobId")}`, query: { wait: waitS > 0 ? waitS : undefined },
      retry: true, ...common(options),
      // The server may hold the answer for the whole wait: the timeout bounds the time beyond it.
      timeoutMs: (options.timeoutMs ?? this.http.timeoutMs) + waitS * 1000,
    });
  }

  list(params: ListJobsParams = {}): Promise<JobList> {
    return this.http.json<JobList>({
      method: "GET", path: "/v1/jobs", query: { status: params.status, limit: params.limit, cursor: params.cursor },
      retry: true, ...common(params),
    });
  }

  /** Long-polls the job (`?wait=`, at most 30 s a request) until it is terminal or `timeoutMs` has
   * passed, and returns it either way: check `status`. An outage meanwhile (a connection error, a 5xx, a
   * 429, each after the client's own retries) is waited out, polling again every second or so (the
   * server's Retry-After where it sends one); at the deadline the last job seen is returned, or, if no
   * poll ever succeeded, the last error thrown. Other errors (401, 404, ...) are thrown at once. */
  async wait(jobId: string, options: WaitOptions = {}): Promise<Job> {
    const deadline = Date.now() + (options.timeoutMs ?? DEFAULT_WAIT_TIMEOUT_MS);
    let last: Job | undefined;
    for (;;) {
      const waitS = pollSeconds(deadline - Date.now());
      const started = Date.now();
      let pauseS: number;
      try {
        const job = await this.get(jobId, { wait: waitS, owner: options.owner, signal: options.signal });
        if (isTerminal(job.status) || Date.now() >= deadline) return job;
        last = job;
        pauseS = MIN_POLL_INTERVAL_S - (Date.now() - started) / 1000;
      } catch (err) {
        if (!isOutage(err)) throw err;
        const leftS = (deadline - Date.now()) / 1000;
        if (leftS <= 0) {
          if (last) return last;
          throw err;
        }
        // Never past the deadline: the poll after this pause is the last look, at it.
        pauseS = Math.min(Math.max(err.retryAfter ?? OUTAGE_PAUSE_S, MIN_POLL_INTERVAL_S), leftS);
      }
      if (pauseS > 0) await sleep(pauseS, options.signal);
    }
  }

  /** POST /v1/jobs/{id}/cancel: cancelled and fully refunded; InvalidStateError when already terminal.
   * Not retried on its own: a lost answer to a cancel that worked would come back as invalid_state. */
  cancel(jobId: string, options: CallOptions = {}): Promise<Job> {
    return this.http.json<Job>({ method: "POST", path: `/v1/jobs/${segment(jobId, "jobId")}/cancel`,
      ...common(options) });
  }

  /** Output `index`: its bytes or, given a `path`, written to that file (beside it under a temporary
   * name, moved into place only once complete and checked against the answer's length and sha256; a
   * failed download leaves nothing behind), as the Python client's `download(job_id, index, path)`.
   * A 302 to a presigned URL is followed without our Authorization and Longcall-Owner headers: the URL
   * carries its own short-lived signature. */
  download(jobId: string, index: number, options?: CallOptions): Promise<Uint8Array>;
  download(jobId: string, index: number, path: string, options?: CallOptions): Promise<DownloadedOutput>;
  async download(jobId: string, index: number, pathOrOptions?: string | CallOptions,
    pathOptions: CallOptions = {}): Promise<Uint8Array | DownloadedOutput> {
    const path = typeof pathOrOptions === "string" ? pathOrOptions : undefined;
    if (path === "") throw new TypeError("path must be a non-empty string");
    const response = await this.output(jobId, index, path === undefined ? pathOrOptions as CallOptions ?? {}
      : pathOptions);
    return path === undefined ? new Uint8Array(await response.arrayBuffer()) : writeDownload(response, path);
  }

  /** The 200 answer carrying output `index`'s bytes: ours, or the storage's behind a 302. */
  private async output(jobId: string, index: number, options: CallOptions): Promise<Response> {
    if (!Number.isSafeInteger(index) || index < 0) throw new TypeError("index must be a whole number ≥ 0");
    const call = {
      method: "GET" as const, path: `/v1/jobs/${segment(jobId, "jobId")}/outputs/${index}`, retry: true,
      acceptRedirect: true, ...common(options),
    };
    const first = await this.http.send(call);
    if (first.type === "opaqueredirect") {
      // Browsers hide a manual redirect's Location; there is no way to follow it without our headers.
      throw new LongcallError("unexpected_response", `GET ${call.path}: a redirect this runtime cannot read`, 0);
    }
    if (first.status < 300) return first;
    const location = first.headers.get("location");
    await first.body?.cancel();
    if (!location) throw new LongcallError("unexpected_response", `GET ${call.path}: a redirect without Location`,
      first.status);
    return this.fetchPresigned(new URL(location, this.http.url(call)), call.path, options);
  }

  private async fetchPresigned(url: URL, path: string, options: CallOptions): Promise<Response> {
    const timeout = AbortSignal.timeout(options.timeoutMs ?? this.http.timeoutMs);
    const signal = options.signal ? AbortSignal.any([timeout, options.signal]) : timeout;
    let response: Response;
    try {
      response = await this.http.fetch(url.toString(), { method: "GET", signal });
    } catch (err) {
      if (options.signal?.aborted) throw options.signal.reason;
      // The URL is a bearer credential for a minute: it stays out of messages.
      throw new ConnectionError("connection_error", `GET ${path}: the storage server did not answer`, 0,
        { cause: err });
    }
    if (!response.ok) {
      await response.body?.cancel();
      throw new LongcallError("unexpected_response", `GET ${path}: the storage server answered HTTP ${response.status}`,
        response.status);
    }
    return response;
  }

  /** GET /v1/jobs/{id}/events: the job's timeline, oldest first. */
  events(jobId: string, options: CallOptions = {}): Promise<JobEvents> {
    return this.http.json<JobEvents>({ method: "GET", path: `/v1/jobs/${segment(jobId, "jobId")}/events`,
      retry: true, ...common(options) });
  }
}

export class AccountResource {
  constructor(private readonly http: Transport) {}

  get(options: CallOptions = {}): Promise<Account> {
    return this.http.json<Account>({ method: "GET", path: "/v1/account", retry: true, ...common(options) });
  }
}

export class Models {
  constructor(private readonly http: Transport) {}

  list(options: CallOptions = {}): Promise<ModelList> {
    return this.http.json<ModelList>({ method: "GET", path: "/v1/models", retry: true, ...common(options) });
  }
}

export class WebhookEndpoints {
  constructor(private readonly http: Transport) {}

  /** The answer holds the endpoint's `secret`, shown only here. Not retried: a retry could make two. */
  create(params: CreateWebhookEndpointParams): Promise<CreatedWebhookEndpoint> {
    const body: Record<string, unknown> = { url: params.url };
    if (params.events !== undefined) body.events = params.events;
    return this.http.json<CreatedWebhookEndpoint>({ method: "POST", path: "/v1/webhook-endpoints", body,
      ...common(params) });
  }

  list(options: CallOptions = {}): Promise<WebhookEndpointList> {
    return this.http.json<WebhookEndpointList>({ method: "GET", path: "/v1/webhook-endpoints", retry: true,
      ...common(options) });
  }

  async delete(endpointId: string, options: CallOptions = {}): Promise<void> {
    await this.http.json<undefined>({ method: "DELETE",
      path: `/v1/webhook-endpoints/${segment(endpointId, "endpointId")}`, ...common(options) });
  }
}

export class Notifications {
  constructor(private readonly http: Transport) {}

  list(params: ListNotificationsParams = {}): Promise<NotificationList> {
    return this.http.json<NotificationList>({ method: "GET", path: "/v1/notifications",
      query: { job_id: params.jobId, limit: params.limit, cursor: params.cursor }, retry: true, ...common(params) });
  }

  /** Queues the notification's deliveries again (the same `webhook-id`: receivers deduplicate on it) and
   * answers the notification. InvalidStateError when there is nothing to send again (each delivery
   * still pending, or its endpoint deleted). */
  redeliver(notificationId: string, options: CallOptions = {}): Promise<Notification> {
    return this.http.json<Notification>({ method: "POST",
      path: `/v1/notifications/${segment(notificationId, "notificationId")}/redeliver`, ...common(options) });
  }
}

/** A platform's owners (a platform owner's key only; any other key gets NotFoundError). These calls never
 * send `Longcall-Owner`, not even the client's default `owner`: the server refuses it here. */
export class Owners {
  constructor(private readonly http: Transport) {}

  /** POST /v1/owners. The same key and body give back the same owner (200), never a second one. */
  async create(params: CreateOwnerParams): Promise<Owner> {
    const body: Record<string, unknown> = { name: params.name };
    if (params.credits !== undefined) body.credits = params.credits;
    if (params.maxActive !== undefined) body.max_active = params.maxActive;
    const key = idempotencyKeyOf(params.idempotencyKey);
    return this.http.json<Owner>({
      method: "POST", path: "/v1/owners", body, idempotencyKey: key, retry: true, ...platformCommon(params),
    });
  }

  /** GET /v1/owners: newest first. */
  list(params: ListOwnersParams = {}): Promise<OwnerPage> {
    return this.http.json<OwnerPage>({
      method: "GET", path: "/v1/owners", query: { limit: params.limit, cursor: params.cursor }, retry: true,
      ...platformCommon(params),
    });
  }

  get(ownerId: string, options: PlatformCallOptions = {}): Promise<Owner> {
    return this.http.json<Owner>({ method: "GET", path: `/v1/owners/${segment(ownerId, "ownerId")}`, retry: true,
      ...platformCommon(options) });
  }

  /** POST /v1/owners/{id}/grants: adds `credits` (negative takes them back) and answers the owner after it.
   * Taking back more than its balance is InsufficientCreditsError, and nothing changes. */
  async grant(ownerId: string, credits: number, options: GrantOptions = {}): Promise<Owner> {
    const body: Record<string, unknown> = { credits };
    if (options.reason !== undefined) body.reason = options.reason;
    const key = idempotencyKeyOf(options.idempotencyKey);
    return this.http.json<Owner>({
      method: "POST", path: `/v1/owners/${segment(ownerId, "ownerId")}/grants`, body, idempotencyKey: key,
      retry: true, ...platformCommon(options),
    });
  }
}

/**
 * The key a create or grant sends: the one given, checked here as the API checks it (1 to 255
 * printable ASCII characters once trimmed), since another could not even be sent as a header;
 * or a new UUID.
 */
function idempotencyKeyOf(given: string | undefined): string {
  if (given === undefined) return globalThis.crypto.randomUUID();
  // Stripped, as the API strips it (and fetch would): the key sent, and the one its errors carry.
  const key = given.trim();
  if (!/^[\x20-\x7e]{1,255}$/.test(key)) {
    throw new InvalidRequestError("invalid_request", "idempotencyKey must be 1 to 255 printable ASCII characters", 0);
  }
  return key;
}
