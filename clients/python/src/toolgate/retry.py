"""Opt-in retries: only what the sidecar marks `retryable`, waiting at least `retry_after_ms`.

A tool result is retried when `retryable` is true (rate limited, approval still pending, a
read-only tool timing out, a backend that was never reached, overload) and never otherwise: the
sidecar alone decides that a repeat is safe, and a write that may have reached its backend (a
timeout, a 5xx answer, a connection broken after sending) is not. Nothing is guessed from the
status or error type. A transport failure (UNAVAILABLE by default) is retried only for calls that
cannot run a tool twice: ListTools, the approval reads, and ExecuteTool(s) calls that carry an
idempotency key (the sidecar answers their repeat from its record of the key).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

import grpc


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry. Every attempt still has its own deadline."""

    max_attempts: int = 3
    initial_backoff: float = 0.2
    max_backoff: float = 5.0
    multiplier: float = 2.0
    # A result asking to wait longer than this is returned as it is instead of waited for.
    max_retry_after: float = 30.0
    transport_codes: Collection[grpc.StatusCode] = (grpc.StatusCode.UNAVAILABLE,)
    # Up to this fraction is added to each wait so that many clients do not retry in step.
    jitter: float = 0.1
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    async_sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be non-negative and the multiplier at least 1")

    def backoff(self, attempt: int) -> float:
        """The wait before attempt `attempt + 1` (attempt counts from 1)."""
        base = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        return base * (1 + random.uniform(0, self.jitter))

    def wait_for(self, attempt: int, retry_after_ms: int) -> float | None:
        """The wait before the next attempt, or None when there is none to make."""
        if attempt >= self.max_attempts:
            return None
        if retry_after_ms:
            asked = retry_after_ms / 1000.0
            if asked > self.max_retry_after:
                return None
            return asked * (1 + random.uniform(0, self.jitter))
        return self.backoff(attempt)
