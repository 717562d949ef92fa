// The JSON shapes of longcall's HTTP API, as /work/shared/CONTRACT.md writes them.
// Field names stay snake_case: these are the bodies the server sends, unchanged.

export type JobStatus =
  | "queued"
  | "submitting"
  | "running"
  | "uncertain"
  | "succeeded"
  | "failed"
  | "cancelled"
  | "expired";

/** The statuses a job never leaves. */
export const TERMINAL_STATUSES: readonly JobStatus[] = ["succeeded", "failed", "cancelled", "expired"];

export function isTerminal(status: JobStatus): boolean {
  return TERMINAL_STATUSES.includes(status);
}

export interface JobOutput {
  index: number;
  /** A path on the longcall server (with `?token=` when the job was read by its token). */
  url: string;
  content_type: string;
  bytes: number;
  /** Lowercase hex SHA-256 of the stored bytes. */
  sha256: string;
  /** Names the output when a task has several kinds (a dubbing language, a track), else null. */
  label: string | null;
}

export interface JobError {
  /** e.g. provider_failed, submit_rejected, settle_exhausted, give_up, output_too_large,
   * output_refused, output_expired, call_lost, resolved_failed. */
  code: string;
  message: string;
}

export interface JobCredits {
  reserved: number;
  charged: number;
  refunded: number;
}

export interface Job {
  id: string;
  owner_id: string;
  status: JobStatus;
  provider: string;
  model: string;
  input: Record<string, unknown>;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  credits: JobCredits;
  outputs: JobOutput[];
  error: JobError | null;
  metadata: Record<string, unknown>;
  /** A path on the server with a signed read token: readable without the API key. */
  status_url: string;
}

export interface JobList {
  jobs: Job[];
  next_cursor: string | null;
}

export type JobEventType =
  | "created"
  | "submit_sent"
  | "task_saved"
  | "call_started"
  | "webhook_accepted"
  | "status_checked"
  | "output_stored"
  | "closed"
  | "notification_delivered"
  | "notification_failed";

export interface JobEvent {
  at: string;
  type: JobEventType;
  detail: Record<string, unknown>;
}

export interface JobEvents {
  events: JobEvent[];
}

export interface Account {
  owner_id: string;
  credits: { balance: number; reserved: number; charged: number };
  active: number;
  max_active: number;
}

export interface ModelPrice {
  credits: number;
  per: "job" | "output" | "second" | "1k_tokens" | "1k_characters" | "provider";
}

export interface ModelEntry {
  provider: string;
  model: string;
  price: ModelPrice | null;
  give_up_after_s: number;
  kind: "async" | "sync";
}

export interface ModelList {
  models: ModelEntry[];
}

export type NotificationEventType =
  | "job.running"
  | "job.succeeded"
  | "job.failed"
  | "job.cancelled"
  | "job.expired"
  | "job.uncertain";

export interface WebhookEndpoint {
  id: string;
  url: string;
  events: NotificationEventType[];
  created_at: string;
}

/** The answer to creating an endpoint: the only time its secret is shown. */
export interface CreatedWebhookEndpoint extends WebhookEndpoint {
  /** `whsec_…`: give it to verifyWebhook. */
  secret: string;
}

export interface NotificationDelivery {
  endpoint_id: string;
  status: "pending" | "delivered" | "failed";
  attempts: number;
  last_status_code: number | null;
  last_attempt_at: string | null;
}

export interface Notification {
  id: string;
  type: NotificationEventType;
  job_id: string;
  created_at: string;
  deliveries: NotificationDelivery[];
}

export interface NotificationList {
  notifications: Notification[];
  next_cursor: string | null;
}

/** The body of a notification delivered to an endpoint (what verifyWebhook returns). */
export interface NotificationPayload {
  id: string;
  type: NotificationEventType;
  created_at: string;
  data: Job;
}

export interface WebhookEndpointList {
  webhook_endpoints: WebhookEndpoint[];
}

/** An owner under a platform (`/v1/owners`): granted = balance + reserved + charged. */
export interface Owner {
  owner_id: string;
  name: string;
  credits: { granted: number; balance: number; reserved: number; charged: number };
  /** Jobs not yet terminal, against `max_active`. */
  active: number;
  max_active: number;
  created_at: string;
}

export interface OwnerPage {
  owners: Owner[];
  next_cursor: string | null;
}
