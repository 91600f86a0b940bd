"""Who is calling: sent as gRPC metadata on every RPC, never in a request body.

- `BearerToken("...")`: a fixed JWT (`authorization: Bearer ...`).
- `TokenProvider(fetch)`: a JWT from your callable, cached for `refresh_after` seconds and fetched
  again early when the sidecar answers UNAUTHENTICATED (the client then retries that call once:
  a refused identity means nothing ran).
- `DevIdentity(tenant=...)`: the x-toolgate-* headers, for catalogs with
  `identity.dev_identity: true` such as the embedded demo.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DevIdentity:
    """The demo's unauthenticated identity headers. Development only."""

    tenant: str
    subject: str = ""
    agent: str = ""
    scopes: Sequence[str] = ()

    def metadata(self) -> Metadata:
        pairs = [("x-toolgate-tenant", self.tenant)]
        if self.subject:
            pairs.append(("x-toolgate-subject", self.subject))
        if self.agent:
            pairs.append(("x-toolgate-agent", self.agent))
        if self.scopes:
            pairs.append(("x-toolgate-scopes", ",".join(self.scopes)))
        return tuple(pairs)


@dataclass(frozen=True)
class BearerToken:
    """A fixed JWT."""

    token: str = field(repr=False)

    def metadata(self) -> Metadata:
        return (("authorization", f"Bearer {self.token}"),)


class TokenProvider:
    """A JWT fetched from `fetch` (sync, or async for AsyncClient), cached and refreshed.

    `fetch` is called on first use, again once `refresh_after` seconds have passed, and again after
    the sidecar refused the cached token. Thread-safe; concurrent callers share one fetch.
    """

    def __init__(
        self,
        fetch: Callable[[], str] | Callable[[], Awaitable[str]],
        *,
        refresh_after: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if refresh_after <= 0:
            raise ValueError("refresh_after must be positive")
        self._fetch = fetch
        self._refresh_after = refresh_after
        self._clock = clock
        self._token: str | None = None
        self._fetched_at = 0.0
        self._lock = threading.Lock()
        self._async_lock: asyncio.Lock | None = None

    def _fresh(self) -> str | None:
        if self._token is not None and self._clock() - self._fetched_at < self._refresh_after:
            return self._token
        return None

    def _store(self, token: object) -> str:
        if not isinstance(token, str) or not token:
            raise TypeError("the token provider must return a non-empty str")
        self._token, self._fetched_at = token, self._clock()
        return token

    def invalidate(self, token: str) -> None:
        """Forget `token` (the sidecar refused it) so the next use fetches a new one."""
        with self._lock:
            if self._token == token:
                self._token = None

    def token(self) -> str:
        with self._lock:
            if (cached := self._fresh()) is not None:
                return cached
            token = self._fetch()
            if inspect.isawaitable(token):
                if inspect.iscoroutine(token):
                    token.close()  # never awaited; closing avoids a "never awaited" warning
                raise TypeError("an async token provider needs AsyncClient")
            return self._store(token)

    async def atoken(self) -> str:
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
            with self._lock:
                if (cached := self._fresh()) is not None:
                    return cached
            token = self._fetch()
            if inspect.isawaitable(token):
                token = await token
            with self._lock:
                return self._store(token)


Identity = DevIdentity | BearerToken | TokenProvider
