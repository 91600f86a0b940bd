/**
 * Who is calling: sent as gRPC metadata with every RPC, never in a request body.
 *
 * - `bearerToken(jwt)`: a fixed JWT (`authorization: Bearer ...`).
 * - `tokenProvider(fetch)`: a JWT from your function, reused for `refreshAfterMs` and fetched again
 *   early when the sidecar answers UNAUTHENTICATED (the client then repeats that call once: a
 *   refused identity means nothing ran).
 * - `devIdentity({ tenant, ... })`: the x-toolgate-* headers, for catalogs with
 *   `identity.dev_identity: true` such as the embedded demo.
 */

export interface Identity {
  /** The metadata for the next call, and the token used (for `invalidate`), if any. */
  headers(): Promise<{ headers: Record<string, string>; token?: string }>;
  /** Forget a token the sidecar refused; false when there is nothing to refresh. */
  invalidate(token: string): boolean;
}

export interface DevIdentityFields {
  tenant: string;
  subject?: string;
  agent?: string;
  scopes?: string[];
}

/** The demo's unauthenticated identity headers. Development only. */
export function devIdentity(fields: DevIdentityFields): Identity {
  const headers: Record<string, string> = { 'x-toolgate-tenant': fields.tenant };
  if (fields.subject) headers['x-toolgate-subject'] = fields.subject;
  if (fields.agent) headers['x-toolgate-agent'] = fields.agent;
  if (fields.scopes?.length) headers['x-toolgate-scopes'] = fields.scopes.join(',');
  return { headers: async () => ({ headers }), invalidate: () => false };
}

/** A fixed JWT. */
export function bearerToken(token: string): Identity {
  return { headers: async () => ({ headers: { authorization: `Bearer ${token}` } }), invalidate: () => false };
}

export interface TokenProviderOptions {
  /** How long a fetched token is reused (default 300 000 ms). */
  refreshAfterMs?: number;
  /** Milliseconds from any fixed point (default `performance.now`); tests inject their own. */
  clock?: () => number;
}

/** A JWT from `fetch`, cached and refreshed; concurrent callers share one fetch. */
export function tokenProvider(fetch: () => string | Promise<string>, options: TokenProviderOptions = {}): Identity {
  const refreshAfterMs = options.refreshAfterMs ?? 300_000;
  const clock = options.clock ?? (() => performance.now());
  if (!(refreshAfterMs > 0)) throw new RangeError('refreshAfterMs must be positive');
  let cached: { token: string; at: number } | undefined;
  let inFlight: Promise<string> | undefined;

  async function token(): Promise<string> {
    if (cached && clock() - cached.at < refreshAfterMs) return cached.token;
    inFlight ??= (async () => {
      try {
        const fetched = await fetch();
        if (typeof fetched !== 'string' || !fetched) throw new TypeError('the token provider must return a non-empty string');
        cached = { token: fetched, at: clock() };
        return fetched;
      } finally {
        inFlight = undefined;
      }
    })();
    return inFlight;
  }

  return {
    async headers() {
      const value = await token();
      return { headers: { authorization: `Bearer ${value}` }, token: value };
    },
    invalidate(refused: string) {
      if (cached?.token === refused) cached = undefined;
      return true;
    },
  };
}
