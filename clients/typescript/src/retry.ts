/**
 * Opt-in retries: only what the sidecar marks `retryable`, waiting at least `retryAfterMs`.
 * A transport failure (UNAVAILABLE by default) is retried only for calls that cannot run a tool
 * twice: listTools, the approval reads, and calls that carry an idempotency key.
 */
import type { GrpcCode } from './errors.js';

export interface RetryPolicy {
  maxAttempts?: number;
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  multiplier?: number;
  /** A result asking to wait longer than this is returned as it is instead of waited for. */
  maxRetryAfterMs?: number;
  transportCodes?: GrpcCode[];
  /** Up to this fraction is added to each wait so that many clients do not retry in step. */
  jitter?: number;
  /** How to wait (tests record instead of waiting). */
  sleep?: (ms: number) => Promise<void>;
}

export interface ResolvedRetryPolicy extends Required<RetryPolicy> {}

export function resolveRetryPolicy(policy: RetryPolicy): ResolvedRetryPolicy {
  const resolved: ResolvedRetryPolicy = {
    maxAttempts: 3,
    initialBackoffMs: 200,
    maxBackoffMs: 5_000,
    multiplier: 2,
    maxRetryAfterMs: 30_000,
    transportCodes: ['UNAVAILABLE'],
    jitter: 0.1,
    sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
    ...policy,
  };
  if (!(resolved.maxAttempts >= 1)) throw new RangeError('maxAttempts must be at least 1');
  return resolved;
}

/** The wait before the next attempt after `attempt` attempts, or undefined for none. */
export function waitFor(policy: ResolvedRetryPolicy, attempt: number, retryAfterMs: number): number | undefined {
  if (attempt >= policy.maxAttempts) return undefined;
  const spread = 1 + Math.random() * policy.jitter;
  if (retryAfterMs > 0) return retryAfterMs > policy.maxRetryAfterMs ? undefined : retryAfterMs * spread;
  const base = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.multiplier ** (attempt - 1));
  return base * spread;
}
