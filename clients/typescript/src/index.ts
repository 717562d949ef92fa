// longcall-client: a fetch-based client for longcall's HTTP API, and verifyWebhook for its notifications.

export {
  Client,
  MAX_WAIT_S,
  type CallOptions,
  type ClientOptions,
  type CreateJobParams,
  type CreateOwnerParams,
  type CreateWebhookEndpointParams,
  type GetJobOptions,
  type GrantOptions,
  type ListJobsParams,
  type ListNotificationsParams,
  type ListOwnersParams,
  type PlatformCallOptions,
  type WaitOptions,
} from "./client.js";
export * from "./errors.js";
export type { DownloadedOutput } from "./files.js";
export type { FetchLike } from "./http.js";
export * from "./types.js";
export { verifyWebhook, type VerifyWebhookOptions, type WebhookHeaders } from "./webhooks.js";
