/**
 * What the framework adapters share: tool names model APIs accept, and approval memory.
 *
 * Approval memory: when a call comes back APPROVAL_REQUIRED, the adapter remembers its approval id
 * under (run, tool, canonical arguments). When the model proposes the same call again in the same
 * run (after a person approved it), the adapter sends that approval id with it, so the approval
 * round trip needs nothing from the model but repeating itself.
 */
import type { ToolDefinition, ToolResult } from './models.js';

const NAME_NOT_OK = /[^A-Za-z0-9_-]/g;
const MAX_NAME = 64;

/** Maps the name shown to the model to each tool (dots and other characters become `_`). */
export function modelToolNames(tools: ToolDefinition[]): Map<string, ToolDefinition> {
  const names = new Map<string, ToolDefinition>();
  for (const tool of tools) {
    const name = tool.name.replace(NAME_NOT_OK, '_').slice(0, MAX_NAME);
    const taken = names.get(name);
    if (taken) throw new Error(`tools ${taken.name} and ${tool.name} both map to the model name ${name}`);
    names.set(name, tool);
  }
  return names;
}

/** JSON with object keys sorted, so equal arguments give equal keys. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`).join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

/** Approval ids handed out in one toolset, by (run, tool, canonical arguments). Bounded. */
export class ApprovalMemory {
  private readonly entries = new Map<string, string>();
  constructor(private readonly maxEntries = 256) {}

  static key(runId: string, tool: string, args: unknown): string {
    return JSON.stringify([runId, tool, canonical(args)]);
  }

  approvalFor(key: string): string {
    return this.entries.get(key) ?? '';
  }

  record(key: string, result: ToolResult): void {
    if (result.status === 'APPROVAL_REQUIRED' && result.approvalId) {
      this.entries.delete(key);
      this.entries.set(key, result.approvalId);
      while (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    } else if (result.errorType !== 'approval_pending') {
      // Used (OK) or refused for good; a pending one stays for the next repeat.
      this.entries.delete(key);
    }
  }
}

/** The result's fields for a framework's artifact slot. */
export function resultSummary(result: ToolResult) {
  return {
    callId: result.callId,
    status: result.status,
    errorType: result.errorType,
    refusedBy: result.refusedBy,
    retryable: result.retryable,
    retryAfterMs: result.retryAfterMs,
    approvalId: result.approvalId,
    toolVersion: result.toolVersion,
    durationMs: result.durationMs,
  };
}

export function newRunId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().replaceAll('-', '').slice(0, 16)}`;
}
