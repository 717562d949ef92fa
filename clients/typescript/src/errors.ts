// Errors: one class per error code of the HTTP API (CONTRACT.md), all LongcallError.
// Messages come from the server or from this library, never with the API key in them.

export interface LongcallErrorOptions {
  /** Seconds the server asked us to wait (its Retry-After), where it sent one. */
  retryAfter?: number;
  /** The Idempotency-Key the call was sent with (a create, a grant). */
  idempotencyKey?: string;
  cause?: unknown;
}

export class LongcallError extends Error {
  /** The API's error code (`not_found`, `invalid_request`, ...), or this library's own:
   * `connection_error` (no answer), `unexpected_response` (an answer that is not the API's). */
  readonly code: string;
  /** The HTTP status; 0 when no answer arrived. */
  readonly status: number;
  readonly retryAfter?: number;
  /** The `Idempotency-Key` a create or grant was sent with (the client's own when none was given), on every
   * error such a call throws; undefined for a call without one. Once the client's own retries have run out
   * the server may still have acted: the same call sent again with this key gets that job, owner or grant
   * back (200) instead of a second one. */
  readonly idempotencyKey?: string;

  constructor(code: string, message: string, status: number, options: LongcallErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.status = status;
    if (options.retryAfter !== undefined) this.retryAfter = options.retryAfter;
    if (options.idempotencyKey !== undefined) this.idempotencyKey = options.idempotencyKey;
  }
}

export class UnauthenticatedError extends LongcallError {}
export class NotFoundError extends LongcallError {}
export class InvalidRequestError extends LongcallError {}
export class PayloadTooLargeError extends LongcallError {}
export class UnknownProviderError extends LongcallError {}
export class InsufficientCreditsError extends LongcallError {}
export class CapacityExhaustedError extends LongcallError {}
export class IdempotencyConflictError extends LongcallError {}
export class InvalidStateError extends LongcallError {}
export class MethodNotAllowedError extends LongcallError {}
export class UnavailableError extends LongcallError {}
export class InternalError extends LongcallError {}
/** No answer: the server was unreachable, the connection broke, or the request timed out. */
export class ConnectionError extends LongcallError {}

type ErrorClass = new (code: string, message: string, status: number, options?: LongcallErrorOptions) => LongcallError;

/** The class thrown for each API error code. */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = {
  unauthenticated: UnauthenticatedError,
  not_found: NotFoundError,
  invalid_request: InvalidRequestError,
  payload_too_large: PayloadTooLargeError,
  unknown_provider: UnknownProviderError,
  insufficient_credits: InsufficientCreditsError,
  capacity_exhausted: CapacityExhaustedError,
  idempotency_conflict: IdempotencyConflictError,
  invalid_state: InvalidStateError,
  method_not_allowed: MethodNotAllowedError,
  unavailable: UnavailableError,
  internal: InternalError,
};

/** The error for an API answer; an unknown code still gives a LongcallError carrying it. */
export function apiError(code: string, message: string, status: number, options: LongcallErrorOptions = {}) {
  const Class = Object.hasOwn(ERROR_CLASSES, code) ? ERROR_CLASSES[code]! : LongcallError;
  return new Class(code, message, status, options);
}

/** Thrown by verifyWebhook for any header, timestamp or signature that does not check out. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}
