/**
 * A toolgate client for Node.js: @grpc/grpc-js, with the contract loaded at run time from
 * proto/toolgate/v1/toolgate.proto by @grpc/proto-loader (nothing generated, nothing checked in).
 *
 *   npm ci --prefix examples/typescript
 *   cargo run                                  # the demo sidecar on 127.0.0.1:50051
 *   npm run example --prefix examples/typescript -- --addr 127.0.0.1:50051
 *
 * Three things every toolgate client has to get right, all shown here:
 *
 * - Who is calling travels in gRPC metadata, never in the request body: the demo catalog's dev
 *   identity headers (x-toolgate-tenant, -subject, -agent, -scopes), or `authorization: Bearer <JWT>`
 *   against a sidecar configured for JWTs.
 * - Every tool-level outcome, refusals included, is a ToolResult whose `model_text` goes back to the
 *   model as it is. gRPC errors mean the request itself failed (UNAUTHENTICATED, INVALID_ARGUMENT,
 *   UNAVAILABLE, or the client's own DEADLINE_EXCEEDED / CANCELLED).
 * - Every call has a deadline, and can be cancelled (an AbortSignal here): the sidecar stops the
 *   tool's backend when the client goes away.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** The repository's proto/ directory, the include root of `toolgate/v1/toolgate.proto`. */
export const DEFAULT_PROTO_ROOT = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '..',
  '..',
  'proto',
);

/** Used when a call sets no deadline of its own: a sidecar that does not answer must not hang us. */
export const DEFAULT_TIMEOUT_MS = 10_000;

// Message shapes as proto-loader produces them with the options in `loadToolGate`: field names as in
// the .proto (keepCase), enums as their names, 64-bit integers as decimal strings, every field set.

export type ToolStatus =
  | 'TOOL_STATUS_UNSPECIFIED'
  | 'TOOL_STATUS_OK'
  | 'TOOL_STATUS_ERROR'
  | 'TOOL_STATUS_INVALID_ARGUMENTS'
  | 'TOOL_STATUS_NOT_FOUND'
  | 'TOOL_STATUS_DENIED'
  | 'TOOL_STATUS_RATE_LIMITED'
  | 'TOOL_STATUS_APPROVAL_REQUIRED'
  | 'TOOL_STATUS_TIMEOUT'
  | 'TOOL_STATUS_CANCELLED'
  | 'TOOL_STATUS_STALE_CATALOG'
  | 'TOOL_STATUS_UNAVAILABLE';

export type RiskLevel =
  | 'RISK_LEVEL_UNSPECIFIED'
  | 'RISK_LEVEL_READ_ONLY'
  | 'RISK_LEVEL_WRITE_DRAFT'
  | 'RISK_LEVEL_WRITE_CONFIRMED'
  | 'RISK_LEVEL_DESTRUCTIVE';

export interface ToolDefinition {
  name: string;
  version: string;
  description: string;
  /** The tool's input JSON Schema as JSON text, server-bound properties removed. */
  input_schema_json: string;
  risk_level: RiskLevel;
  required_scopes: string[];
  timeout_ms: number;
  labels: Record<string, string>;
  requires_approval: boolean;
}

export interface ListToolsResponse {
  tools: ToolDefinition[];
  catalog_revision: string;
}

/** One call the model proposed. Only `name` and `arguments_json` are required. */
export interface ToolCall {
  call_id?: string;
  name: string;
  /** The arguments as the JSON text the model produced; must be a JSON object. */
  arguments_json: string;
  version?: string;
  idempotency_key?: string;
  approval_id?: string;
}

export interface ToolResult {
  call_id: string;
  status: ToolStatus;
  output: string;
  /** Exactly what to append to the conversation for the model, on success and refusal alike. */
  model_text: string;
  error_type: string;
  error_message: string;
  retryable: boolean;
  user_visible: boolean;
  tool_version: string;
  approval_id: string;
  retry_after_ms: string;
  duration_ms: string;
  refused_by: string;
  idempotent_replay: boolean;
}

interface ExecuteToolRequest {
  call: ToolCall;
  run_id?: string;
  step?: number;
  catalog_revision?: string;
}

interface ExecuteToolResponse {
  result: ToolResult;
}

/** Who is calling, sent as the demo catalog's dev-identity metadata. */
export interface Identity {
  tenant: string;
  subject?: string;
  agent?: string;
  scopes?: string[];
}

export interface CallOptions {
  /** The call's deadline, in milliseconds from now (default DEFAULT_TIMEOUT_MS). */
  timeoutMs?: number;
  /** Aborting it cancels the call: the promise rejects with gRPC status CANCELLED. */
  signal?: AbortSignal;
}

export interface ExecuteOptions extends CallOptions {
  /** The agent run the call belongs to (audit, tracing, approval binding). */
  runId?: string;
  /** The step (model turn) of the run. */
  step?: number;
  /** The catalog_revision the model was shown; a tool that changed since is refused as stale. */
  catalogRevision?: string;
}

/** Loads the ToolGate service from the .proto files under `protoRoot`. */
export function loadToolGate(protoRoot: string = DEFAULT_PROTO_ROOT): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync('toolgate/v1/toolgate.proto', {
    includeDirs: [protoRoot],
    keepCase: true,
    enums: String,
    longs: String,
    defaults: true,
    oneofs: true,
  });
  const loaded = grpc.loadPackageDefinition(definition);
  const v1 = (loaded.toolgate as grpc.GrpcObject).v1 as grpc.GrpcObject;
  return v1.ToolGate as grpc.ServiceClientConstructor;
}

/** A promise-based client for the ToolGate service, acting as one identity. */
export class ToolgateClient {
  private readonly client: grpc.Client;
  private readonly service: grpc.ServiceDefinition;

  constructor(
    address: string,
    private readonly identity: Identity,
    protoRoot: string = DEFAULT_PROTO_ROOT,
  ) {
    const ToolGate = loadToolGate(protoRoot);
    this.service = ToolGate.service;
    // The sidecar listens on loopback (or a Unix socket: `unix:///path/to/toolgate.sock`).
    this.client = new ToolGate(address, grpc.credentials.createInsecure());
  }

  /** The tools this caller's model may see, sorted by name, and the catalog revision. */
  listTools(options: CallOptions = {}): Promise<ListToolsResponse> {
    return this.unary<object, ListToolsResponse>('ListTools', {}, options);
  }

  /** Runs one call through the sidecar; resolves with its ToolResult whatever the tool's outcome. */
  async executeTool(call: ToolCall, options: ExecuteOptions = {}): Promise<ToolResult> {
    const request: ExecuteToolRequest = {
      call,
      run_id: options.runId ?? '',
      step: options.step ?? 0,
      catalog_revision: options.catalogRevision ?? '',
    };
    const response = await this.unary<ExecuteToolRequest, ExecuteToolResponse>(
      'ExecuteTool',
      request,
      options,
    );
    return response.result;
  }

  close(): void {
    this.client.close();
  }

  private metadata(): grpc.Metadata {
    // With a JWT-configured sidecar: metadata.set('authorization', `Bearer ${token}`) instead.
    const metadata = new grpc.Metadata();
    metadata.set('x-toolgate-tenant', this.identity.tenant);
    if (this.identity.subject) metadata.set('x-toolgate-subject', this.identity.subject);
    if (this.identity.agent) metadata.set('x-toolgate-agent', this.identity.agent);
    if (this.identity.scopes?.length) metadata.set('x-toolgate-scopes', this.identity.scopes.join(','));
    return metadata;
  }

  /** One unary call with a deadline, cancelled when `options.signal` aborts. */
  private unary<Req, Res>(method: string, request: Req, options: CallOptions): Promise<Res> {
    const definition = this.service[method] as grpc.MethodDefinition<Req, Res>;
    const { timeoutMs = DEFAULT_TIMEOUT_MS, signal } = options;
    return new Promise<Res>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const onAbort = () => call.cancel();
      const call = this.client.makeUnaryRequest<Req, Res>(
        definition.path,
        definition.requestSerialize,
        definition.responseDeserialize,
        request,
        this.metadata(),
        { deadline: Date.now() + timeoutMs },
        (error, response) => {
          signal?.removeEventListener('abort', onAbort);
          if (error) reject(error);
          else resolve(response as Res);
        },
      );
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** `npm run example -- --addr HOST:PORT`: list the tools, then echo through the sidecar. */
async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      addr: { type: 'string', default: '127.0.0.1:50051' },
      tenant: { type: 'string', default: 'acme' },
    },
  });
  const client = new ToolgateClient(values.addr!, {
    tenant: values.tenant!,
    subject: 'alice',
    agent: 'typescript-example',
    scopes: ['tickets:read', 'tickets:write'],
  });
  try {
    const { tools, catalog_revision } = await client.listTools();
    console.log(`catalog revision ${catalog_revision}`);
    for (const tool of tools) {
      console.log(`  ${tool.name} (${tool.risk_level}): ${tool.input_schema_json}`);
    }
    const result = await client.executeTool(
      { call_id: 'call_1', name: 'echo', arguments_json: JSON.stringify({ text: 'hi from Node' }) },
      { runId: 'typescript-example', step: 1, catalogRevision: catalog_revision },
    );
    console.log(`${result.status}: ${result.model_text}`);
  } finally {
    client.close();
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  });
}
