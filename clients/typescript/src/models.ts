/**
 * Plain, typed views of toolgate.v1 messages (enums as names, 64-bit numbers as numbers), and their
 * conversion from the generated messages. Callers never handle generated classes.
 */
import {
  ApprovalState as PbApprovalState,
  RiskLevel as PbRiskLevel,
  ToolStatus as PbToolStatus,
  type Approval as PbApproval,
  type ListApprovalsResponse,
  type ListToolsResponse,
  type ToolDefinition as PbToolDefinition,
  type ToolResult as PbToolResult,
} from './gen/toolgate/v1/toolgate_pb.js';

/** The outcome of one call: `toolgate.v1.ToolStatus` without its prefix. */
export type ToolStatus = keyof typeof PbToolStatus;
/** What a tool can change. */
export type RiskLevel = keyof typeof PbRiskLevel;
/** Where an approval is in its life. */
export type ApprovalState = keyof typeof PbApprovalState;
/** An approver's answer. */
export type ApprovalDecision = 'APPROVE' | 'REJECT';

/** The name of a generated enum value; UNSPECIFIED for one this client does not know yet. */
function enumName<E extends Record<string, string | number>>(values: E, value: number): keyof E {
  const name = (values as Record<number, string>)[value];
  return (typeof name === 'string' ? name : 'UNSPECIFIED') as keyof E;
}

/** One tool as this caller's model should see it; bound arguments are not in `inputSchema`. */
export interface ToolDefinition {
  name: string;
  version: string;
  description: string;
  /** The visible JSON Schema of the arguments. */
  inputSchema: Record<string, unknown>;
  riskLevel: RiskLevel;
  requiredScopes: string[];
  timeoutMs: number;
  labels: Record<string, string>;
  requiresApproval: boolean;
}

/** What ListTools returned: the visible tools, sorted by name, and the catalog revision. */
export interface ToolList {
  tools: ToolDefinition[];
  catalogRevision: string;
}

/**
 * One call a model proposed. `arguments` is an object (sent as JSON) or the raw JSON text the
 * model produced, passed on unchanged so the sidecar judges exactly what the model wrote.
 */
export interface ToolCall {
  name: string;
  arguments?: Record<string, unknown> | string;
  callId?: string;
  version?: string;
  idempotencyKey?: string;
  approvalId?: string;
}

/** The normalized outcome of one call. Refusals are results too: check `status` or `ok`. */
export interface ToolResult {
  callId: string;
  status: ToolStatus;
  ok: boolean;
  /** Exactly what goes back to the model: the output on OK, `TOOL_ERROR: {...}` otherwise. */
  modelText: string;
  errorType: string;
  errorMessage: string;
  retryable: boolean;
  userVisible: boolean;
  toolVersion: string;
  approvalId: string;
  retryAfterMs: number;
  durationMs: number;
  refusedBy: string;
  idempotentReplay: boolean;
}

/** A request to run one risky call, bound to its exact arguments and caller. */
export interface Approval {
  approvalId: string;
  tenant: string;
  subject: string;
  agent: string;
  runId: string;
  tool: string;
  toolVersion: string;
  argumentsSha256: string;
  state: ApprovalState;
  riskLevel: RiskLevel;
  createdAtUnixMs: number;
  expiresAtUnixMs: number;
  decidedBy: string;
  reason: string;
  /** Full canonical arguments: only from getApproval (list pages carry the preview). */
  argumentsJson: string;
  /** At most 1 KiB of the canonical arguments, for a list view. */
  argumentsPreview: string;
  argumentsTruncated: boolean;
}

/** One page of ListApprovals; pass `nextPageToken` on for the next (blank: the last page). */
export interface ApprovalPage {
  approvals: Approval[];
  nextPageToken: string;
}

export function toolDefinition(message: PbToolDefinition): ToolDefinition {
  let schema: unknown = {};
  try {
    schema = message.inputSchemaJson ? JSON.parse(message.inputSchemaJson) : {};
  } catch {
    schema = {};
  }
  return {
    name: message.name,
    version: message.version,
    description: message.description,
    inputSchema: schema && typeof schema === 'object' && !Array.isArray(schema) ? (schema as Record<string, unknown>) : {},
    riskLevel: enumName(PbRiskLevel, message.riskLevel),
    requiredScopes: [...message.requiredScopes],
    timeoutMs: message.timeoutMs,
    labels: { ...message.labels },
    requiresApproval: message.requiresApproval,
  };
}

export function toolList(message: ListToolsResponse): ToolList {
  return { tools: message.tools.map(toolDefinition), catalogRevision: message.catalogRevision };
}

export function toolResult(message: PbToolResult | undefined): ToolResult {
  if (!message) throw new Error('the sidecar answered without a result');
  const status = enumName(PbToolStatus, message.status);
  return {
    callId: message.callId,
    status,
    ok: status === 'OK',
    modelText: message.modelText,
    errorType: message.errorType,
    errorMessage: message.errorMessage,
    retryable: message.retryable,
    userVisible: message.userVisible,
    toolVersion: message.toolVersion,
    approvalId: message.approvalId,
    retryAfterMs: Number(message.retryAfterMs),
    durationMs: Number(message.durationMs),
    refusedBy: message.refusedBy,
    idempotentReplay: message.idempotentReplay,
  };
}

export function approval(message: PbApproval | undefined): Approval {
  if (!message) throw new Error('the sidecar answered without an approval');
  return {
    approvalId: message.approvalId,
    tenant: message.tenant,
    subject: message.subject,
    agent: message.agent,
    runId: message.runId,
    tool: message.tool,
    toolVersion: message.toolVersion,
    argumentsSha256: message.argumentsSha256,
    state: enumName(PbApprovalState, message.state),
    riskLevel: enumName(PbRiskLevel, message.riskLevel),
    createdAtUnixMs: Number(message.createdAtUnixMs),
    expiresAtUnixMs: Number(message.expiresAtUnixMs),
    decidedBy: message.decidedBy,
    reason: message.reason,
    argumentsJson: message.argumentsJson,
    argumentsPreview: message.argumentsPreview,
    argumentsTruncated: message.argumentsTruncated,
  };
}

export function approvalPage(message: ListApprovalsResponse): ApprovalPage {
  return { approvals: message.approvals.map(approval), nextPageToken: message.nextPageToken };
}

export function argumentsJson(call: ToolCall): string {
  if (typeof call.arguments === 'string') return call.arguments;
  return JSON.stringify(call.arguments ?? {});
}
