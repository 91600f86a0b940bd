/**
 * Errors: a transport failure (sidecar down, deadline, refused identity, malformed request) is a
 * TransportError carrying the gRPC code. A tool's refusal is a ToolResult; ToolCallError is thrown
 * for one only when the caller asks (`check: true`).
 */
import { Code, ConnectError } from '@connectrpc/connect';

import type { ToolResult } from './models.js';

/** gRPC status code names, as in the gRPC spec. */
export type GrpcCode =
  | 'OK'
  | 'CANCELLED'
  | 'UNKNOWN'
  | 'INVALID_ARGUMENT'
  | 'DEADLINE_EXCEEDED'
  | 'NOT_FOUND'
  | 'ALREADY_EXISTS'
  | 'PERMISSION_DENIED'
  | 'RESOURCE_EXHAUSTED'
  | 'FAILED_PRECONDITION'
  | 'ABORTED'
  | 'OUT_OF_RANGE'
  | 'UNIMPLEMENTED'
  | 'INTERNAL'
  | 'UNAVAILABLE'
  | 'DATA_LOSS'
  | 'UNAUTHENTICATED';

const CODE_NAMES: Record<number, GrpcCode> = {
  [Code.Canceled]: 'CANCELLED',
  [Code.Unknown]: 'UNKNOWN',
  [Code.InvalidArgument]: 'INVALID_ARGUMENT',
  [Code.DeadlineExceeded]: 'DEADLINE_EXCEEDED',
  [Code.NotFound]: 'NOT_FOUND',
  [Code.AlreadyExists]: 'ALREADY_EXISTS',
  [Code.PermissionDenied]: 'PERMISSION_DENIED',
  [Code.ResourceExhausted]: 'RESOURCE_EXHAUSTED',
  [Code.FailedPrecondition]: 'FAILED_PRECONDITION',
  [Code.Aborted]: 'ABORTED',
  [Code.OutOfRange]: 'OUT_OF_RANGE',
  [Code.Unimplemented]: 'UNIMPLEMENTED',
  [Code.Internal]: 'INTERNAL',
  [Code.Unavailable]: 'UNAVAILABLE',
  [Code.DataLoss]: 'DATA_LOSS',
  [Code.Unauthenticated]: 'UNAUTHENTICATED',
};

/** Base of every error this package throws. */
export class ToolgateError extends Error {
  override name = 'ToolgateError';
}

/** A gRPC call failed; `code` is the gRPC status name, `grpcCode` its number. */
export class TransportError extends ToolgateError {
  override name = 'TransportError';
  constructor(
    readonly method: string,
    readonly code: GrpcCode,
    readonly grpcCode: number,
    readonly details: string,
    options?: { cause?: unknown },
  ) {
    super(`${method} failed: ${code}: ${details}`, options);
  }
}

export class UnauthenticatedError extends TransportError {
  override name = 'UnauthenticatedError';
}
export class PermissionDeniedError extends TransportError {
  override name = 'PermissionDeniedError';
}
export class InvalidArgumentError extends TransportError {
  override name = 'InvalidArgumentError';
}
export class NotFoundError extends TransportError {
  override name = 'NotFoundError';
}
export class FailedPreconditionError extends TransportError {
  override name = 'FailedPreconditionError';
}
export class DeadlineExceededError extends TransportError {
  override name = 'DeadlineExceededError';
}
export class UnavailableError extends TransportError {
  override name = 'UnavailableError';
}
export class CancelledError extends TransportError {
  override name = 'CancelledError';
}

const BY_CODE: Partial<Record<GrpcCode, typeof TransportError>> = {
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  INVALID_ARGUMENT: InvalidArgumentError,
  NOT_FOUND: NotFoundError,
  FAILED_PRECONDITION: FailedPreconditionError,
  DEADLINE_EXCEEDED: DeadlineExceededError,
  UNAVAILABLE: UnavailableError,
  CANCELLED: CancelledError,
};

/** The typed error for a failed RPC. */
export function transportError(method: string, error: unknown): TransportError {
  const connect = ConnectError.from(error);
  // A Unix socket path with no socket (the sidecar not up yet) is as unavailable as a refused TCP
  // port, and nothing was sent; connect-node reports it as INTERNAL.
  const grpcCode = connect.code === Code.Internal && socketMissing(error) ? Code.Unavailable : connect.code;
  const code = CODE_NAMES[grpcCode] ?? 'UNKNOWN';
  const Kind = BY_CODE[code] ?? TransportError;
  return new Kind(method, code, grpcCode, connect.rawMessage, { cause: error });
}

/** Whether connecting failed because the socket file does not exist (ENOENT from `connect`). */
function socketMissing(error: unknown): boolean {
  const seen = new Set<unknown>();
  // Bounded: a cause chain that loops is walked once.
  for (let e = error; e instanceof Error && !seen.has(e); e = e.cause) {
    seen.add(e);
    const { code, syscall } = e as Error & { code?: unknown; syscall?: unknown };
    if (code === 'ENOENT' && syscall === 'connect') return true;
  }
  return false;
}

/** A call did not return OK; thrown only on request (`check: true`, `raiseForStatus`). */
export class ToolCallError extends ToolgateError {
  override name = 'ToolCallError';
  constructor(readonly result: ToolResult) {
    super(`${result.status} ${result.errorType}: ${result.errorMessage} (call ${result.callId})`);
  }
}

/** Returns the result when OK; throws ToolCallError otherwise. */
export function raiseForStatus(result: ToolResult): ToolResult {
  if (!result.ok) throw new ToolCallError(result);
  return result;
}
