/**
 * ToolgateClient: a promise-based client of one toolgate sidecar over the gRPC protocol
 * (@connectrpc/connect-node). Every RPC has a deadline (`timeoutMs`, the client's default unless
 * given) and can be cancelled with an AbortSignal; the sidecar then stops the tool's backend.
 * Transport failures throw TransportError subclasses with the gRPC code; a tool's refusal is a
 * ToolResult unless `check: true`.
 */
import { connect as connectSocket } from 'node:net';

import { type CallOptions, createClient } from '@connectrpc/connect';
import { Http2SessionManager, createGrpcTransport } from '@connectrpc/connect-node';

import { TransportError, UnauthenticatedError, ToolgateError, raiseForStatus, transportError } from './errors.js';
import {
  ApprovalDecision as PbApprovalDecision,
  ApprovalState as PbApprovalState,
  Approvals,
  ToolGate,
} from './gen/toolgate/v1/toolgate_pb.js';
import type { Identity } from './identity.js';
import {
  type Approval,
  type ApprovalDecision,
  type ApprovalPage,
  type ApprovalState,
  type ToolCall,
  type ToolList,
  type ToolResult,
  approval,
  approvalPage,
  argumentsJson,
  toolList,
  toolResult,
} from './models.js';
import { type ResolvedRetryPolicy, type RetryPolicy, resolveRetryPolicy, waitFor } from './retry.js';

export const DEFAULT_ADDRESS = '127.0.0.1:50051';
/** A sidecar that does not answer must not hang the agent. */
export const DEFAULT_TIMEOUT_MS = 10_000;
/** iterApprovals stops (with PageLimitError) after this many pages unless told otherwise. */
export const DEFAULT_MAX_PAGES = 100;

export class PageLimitError extends ToolgateError {
  override name = 'PageLimitError';
}

export interface ClientOptions {
  /**
   * `host:port` of the sidecar (default 127.0.0.1:50051), or its Unix socket as
   * `unix:///path/to/toolgate.sock` (also `unix:/path`, or `unix:relative/path`); or give `baseUrl`.
   */
  address?: string;
  /** e.g. `http://127.0.0.1:50051`; overrides `address`. */
  baseUrl?: string;
  identity: Identity;
  /** The deadline of each RPC unless a call sets its own (default 10 000 ms). */
  timeoutMs?: number;
  /** Opt-in retries for every call (a call can pass its own, or `retry: false`). */
  retry?: RetryPolicy;
  /** Extra metadata sent with every RPC. */
  headers?: Record<string, string>;
}

export interface CallSettings {
  timeoutMs?: number;
  signal?: AbortSignal;
  retry?: RetryPolicy | false;
}

export interface ExecuteSettings extends CallSettings {
  /** The agent run the call belongs to (audit, tracing, approval binding). */
  runId?: string;
  /** The step (model turn) of the run. */
  step?: number;
  /** The catalog revision the model was shown; a tool that changed since is refused as stale. */
  catalogRevision?: string;
  /** Throw ToolCallError for anything but OK. */
  check?: boolean;
}

export interface ExecuteManySettings extends ExecuteSettings {
  /** Run the calls concurrently (default false: one after another). */
  parallel?: boolean;
  /** At most this many at once when parallel; 0 means the server's cap. */
  maxParallel?: number;
}

export interface ListApprovalsSettings extends CallSettings {
  /** Default PENDING. */
  state?: ApprovalState;
  pageSize?: number;
  pageToken?: string;
}

/** One retry budget shared by transport retries and result retries of one call. */
interface Attempts {
  made: number;
}

export class ToolgateClient {
  private readonly toolgate;
  private readonly approvals;
  private readonly sessions: Http2SessionManager;
  private readonly identity: Identity;
  private readonly timeoutMs: number;
  private readonly retry?: ResolvedRetryPolicy;
  private readonly extraHeaders: Record<string, string>;

  constructor(options: ClientOptions) {
    if (!options.identity) throw new TypeError('identity is required: devIdentity, bearerToken or tokenProvider');
    const socketPath = options.baseUrl === undefined ? unixSocketPath(options.address) : undefined;
    // Over a Unix socket the URL only names the `:authority`: `localhost`, as gRPC clients send
    // for Unix targets (the socket's path is not a host name, and HTTP/2 servers refuse it as one).
    const baseUrl = options.baseUrl ?? (socketPath !== undefined ? 'http://localhost' : `http://${options.address ?? DEFAULT_ADDRESS}`);
    this.identity = options.identity;
    this.timeoutMs = checkTimeout(options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    this.retry = options.retry ? resolveRetryPolicy(options.retry) : undefined;
    this.extraHeaders = { ...options.headers };
    // Our own session manager, so close() ends the HTTP/2 connection and lets the process exit.
    this.sessions = new Http2SessionManager(
      baseUrl,
      undefined,
      socketPath === undefined ? undefined : { createConnection: () => connectSocket(socketPath) },
    );
    const transport = createGrpcTransport({ baseUrl, sessionManager: this.sessions });
    this.toolgate = createClient(ToolGate, transport);
    this.approvals = createClient(Approvals, transport);
  }

  /** Closes the connection; calls in flight fail with CANCELLED or UNAVAILABLE. */
  close(): void {
    this.sessions.abort();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** The tools this caller's model may see, and the catalog revision it was shown. */
  async listTools(settings: CallSettings = {}): Promise<ToolList> {
    const response = await this.unary('ListTools', (o) => this.toolgate.listTools({}, o), settings, true, this.policy(settings), {
      made: 0,
    });
    return toolList(response);
  }

  /** Runs one call: `execute('echo', { text: 'hi' })` or `execute({ name, arguments, ... })`. */
  async execute(
    call: ToolCall | string,
    args?: Record<string, unknown> | string,
    settings: ExecuteSettings = {},
  ): Promise<ToolResult> {
    const toolCall: ToolCall = typeof call === 'string' ? { name: call, arguments: args ?? {} } : call;
    if (typeof call !== 'string' && args !== undefined) throw new TypeError('pass the arguments inside the ToolCall');
    const request = {
      call: protoCall(toolCall),
      runId: settings.runId ?? '',
      step: settings.step ?? 0,
      catalogRevision: settings.catalogRevision ?? '',
    };
    const policy = this.policy(settings);
    const attempts: Attempts = { made: 0 };
    for (;;) {
      const response = await this.unary(
        'ExecuteTool',
        (o) => this.toolgate.executeTool(request, o),
        settings,
        Boolean(toolCall.idempotencyKey),
        policy,
        attempts,
      );
      const result = toolResult(response.result);
      const delay = policy && result.retryable ? waitFor(policy, attempts.made, result.retryAfterMs) : undefined;
      if (delay === undefined) return settings.check ? raiseForStatus(result) : result;
      await policy!.sleep(delay);
    }
  }

  /** Runs the calls of one model turn; results come back in the order of `calls`. */
  async executeMany(calls: ToolCall[], settings: ExecuteManySettings = {}): Promise<ToolResult[]> {
    const results: (ToolResult | undefined)[] = calls.map(() => undefined);
    let pending = calls.map((_, i) => i);
    const policy = this.policy(settings);
    const attempts: Attempts = { made: 0 };
    while (pending.length) {
      const batch = pending.map((i) => calls[i]!);
      const request = {
        calls: batch.map(protoCall),
        runId: settings.runId ?? '',
        step: settings.step ?? 0,
        parallel: settings.parallel ?? false,
        maxParallel: settings.maxParallel ?? 0,
        catalogRevision: settings.catalogRevision ?? '',
      };
      const safe = batch.every((c) => Boolean(c.idempotencyKey));
      const response = await this.unary('ExecuteTools', (o) => this.toolgate.executeTools(request, o), settings, safe, policy, attempts);
      pending.forEach((index, n) => {
        results[index] = toolResult(response.results[n]);
      });
      // Only the retryable results are sent again, as a smaller batch.
      const again = pending.filter((i) => results[i]!.retryable);
      const delays = policy ? again.map((i) => waitFor(policy, attempts.made, results[i]!.retryAfterMs)) : [];
      if (!delays.length || delays.some((d) => d === undefined)) break;
      await policy!.sleep(Math.max(...(delays as number[])));
      pending = again;
    }
    const done = results as ToolResult[];
    if (settings.check) done.forEach(raiseForStatus);
    return done;
  }

  /** One page (oldest first) of the approvals of the caller's tenant, with argument previews. */
  async listApprovals(settings: ListApprovalsSettings = {}): Promise<ApprovalPage> {
    const request = {
      state: PbApprovalState[settings.state ?? 'PENDING'],
      pageSize: settings.pageSize ?? 0,
      pageToken: settings.pageToken ?? '',
    };
    const response = await this.unary('ListApprovals', (o) => this.approvals.listApprovals(request, o), settings, true, this.policy(settings), {
      made: 0,
    });
    return approvalPage(response);
  }

  /** Every approval in `state`, page by page; throws PageLimitError past `maxPages` pages. */
  async *iterApprovals(settings: ListApprovalsSettings & { maxPages?: number } = {}): AsyncGenerator<Approval> {
    let pageToken = '';
    const maxPages = settings.maxPages ?? DEFAULT_MAX_PAGES;
    for (let page = 0; page < maxPages; page++) {
      const { approvals, nextPageToken } = await this.listApprovals({ ...settings, pageToken });
      yield* approvals;
      if (!nextPageToken) return;
      pageToken = nextPageToken;
    }
    throw new PageLimitError(`more than ${maxPages} pages of approvals; pass a larger maxPages`);
  }

  /** One approval of the caller's tenant with its full arguments (`argumentsJson`). */
  async getApproval(approvalId: string, settings: CallSettings = {}): Promise<Approval> {
    const response = await this.unary('GetApproval', (o) => this.approvals.getApproval({ approvalId }, o), settings, true, this.policy(settings), {
      made: 0,
    });
    return approval(response.approval);
  }

  /** Approves or rejects a pending approval as this client's identity (not the requester). */
  async decide(approvalId: string, decision: ApprovalDecision, settings: CallSettings & { reason?: string } = {}): Promise<Approval> {
    const request = { approvalId, decision: PbApprovalDecision[decision], reason: settings.reason ?? '' };
    // Never retried: a repeat after a lost answer would see FAILED_PRECONDITION.
    const response = await this.unary('DecideApproval', (o) => this.approvals.decideApproval(request, o), settings, false, undefined, {
      made: 0,
    });
    return approval(response.approval);
  }

  approve(approvalId: string, settings: CallSettings & { reason?: string } = {}): Promise<Approval> {
    return this.decide(approvalId, 'APPROVE', settings);
  }

  reject(approvalId: string, settings: CallSettings & { reason?: string } = {}): Promise<Approval> {
    return this.decide(approvalId, 'REJECT', settings);
  }

  private policy(settings: CallSettings): ResolvedRetryPolicy | undefined {
    if (settings.retry === false) return undefined;
    return settings.retry ? resolveRetryPolicy(settings.retry) : this.retry;
  }

  private async unary<T>(
    method: string,
    send: (options: CallOptions) => Promise<T>,
    settings: CallSettings,
    safe: boolean,
    policy: ResolvedRetryPolicy | undefined,
    attempts: Attempts,
  ): Promise<T> {
    const timeoutMs = settings.timeoutMs === undefined ? this.timeoutMs : checkTimeout(settings.timeoutMs);
    let refreshed = false;
    for (;;) {
      attempts.made++;
      const { headers, token } = await this.identity.headers();
      let error: TransportError;
      try {
        return await send({ timeoutMs, signal: settings.signal, headers: { ...headers, ...this.extraHeaders } });
      } catch (caught) {
        error = transportError(method, caught);
      }
      if (error instanceof UnauthenticatedError && token !== undefined && !refreshed && this.identity.invalidate(token)) {
        // The sidecar refused the token before running anything: fetch a new one, once.
        refreshed = true;
        attempts.made--;
        continue;
      }
      const delay =
        policy && safe && policy.transportCodes.includes(error.code) && !settings.signal?.aborted
          ? waitFor(policy, attempts.made, 0)
          : undefined;
      if (delay === undefined) throw error;
      await policy!.sleep(delay);
    }
  }
}

/** The socket path of a `unix:` address (`unix:///abs`, `unix:/abs`, `unix:rel`), else undefined. */
function unixSocketPath(address: string | undefined): string | undefined {
  if (!address?.startsWith('unix:')) return undefined;
  const rest = address.slice('unix:'.length);
  const path = rest.startsWith('//') ? rest.slice(2) : rest;
  if (!path) throw new TypeError(`no socket path in ${JSON.stringify(address)}`);
  return path;
}

function checkTimeout(timeoutMs: number): number {
  if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) throw new RangeError('every call needs a positive deadline (timeoutMs)');
  return timeoutMs;
}

function protoCall(call: ToolCall) {
  return {
    callId: call.callId ?? '',
    name: call.name,
    argumentsJson: argumentsJson(call),
    version: call.version ?? '',
    idempotencyKey: call.idempotencyKey ?? '',
    approvalId: call.approvalId ?? '',
  };
}
