/**
 * Errors of the cagebox SDK. Every API error carries a stable kind (the
 * Error schema of api/openapi.json; internal/daemon/errors.go maps the
 * daemon's errors to it); each kind has a class here.
 */

/** Base of every SDK error. */
export class CageboxError extends Error {
  /** The API error kind: not_found, invalid, unauthorized, denied, conflict, unavailable, internal (or connection). */
  readonly kind: string;
  /** The HTTP status; 0 when no answer came. */
  readonly status: number;

  constructor(message: string, status = 0, kind = "internal") {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.kind = kind;
  }
}

/** 404: no such sandbox, secret, policy, file, tool or endpoint. */
export class NotFound extends CageboxError {}
/** 400: the request is malformed (bad limits, durations, policy, path). */
export class Invalid extends CageboxError {}
/** 401: no API key, or an unknown or revoked one (TCP only). */
export class Unauthorized extends CageboxError {}
/** 403: the caller may not do this (an admin-only route, a floor, env mode). */
export class Denied extends CageboxError {}
/** 409: the state forbids it (a revoked secret, a stale generation, a name in use). */
export class Conflict extends CageboxError {}
/** 503: a runtime or resource is not available here. */
export class Unavailable extends CageboxError {}
/** 500 (or 504: a deadline passed in the daemon). */
export class InternalError extends CageboxError {}
/** The daemon could not be reached, or the connection broke mid-answer. */
export class ConnectionFailed extends CageboxError {
  constructor(message: string) {
    super(message, 0, "connection");
  }
}

const byKind: Record<string, typeof CageboxError> = {
  not_found: NotFound,
  invalid: Invalid,
  unauthorized: Unauthorized,
  denied: Denied,
  conflict: Conflict,
  unavailable: Unavailable,
  internal: InternalError,
};
const byStatus: Record<number, typeof CageboxError> = {
  404: NotFound,
  400: Invalid,
  401: Unauthorized,
  403: Denied,
  409: Conflict,
  503: Unavailable,
};
const kindOf = new Map<typeof CageboxError, string>(Object.entries(byKind).map(([k, c]) => [c, k]));

/** The error for an API error answer. */
export function errorFor(status: number, kind: string, message: string): CageboxError {
  const cls = byKind[kind] ?? byStatus[status] ?? InternalError;
  return new cls(message, status, kind || kindOf.get(cls) || "internal");
}
