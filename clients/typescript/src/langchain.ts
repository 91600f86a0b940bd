/**
 * LangChain.js adapter: toolgate's tools as `@langchain/core` StructuredTools.
 *
 *   const agent = createAgent({ model, tools: await loadLangChainTools(client) });
 *
 * Name, description and schema come from ListTools (the visible JSON Schema). LangChain.js would
 * validate arguments against it before the tool runs and throw; these tools leave validation to
 * the sidecar, so every call — a model sending a server-bound argument included — is decided and
 * audited there. A call goes through ExecuteTool with LangChain's tool call id as toolgate's call
 * id, the run id (`runId`, else the LangGraph `thread_id`, else one id per toolset) and LangGraph's
 * `langgraph_step`. The tool message is the result's `modelText`; refusals (approval required too)
 * are tool messages with `status: 'error'` the model reads, never exceptions; the message's
 * `artifact` has the status, error type and approval id. Transport failures throw TransportError.
 * Approvals: the repeated call redeems the approval the toolset remembered.
 *
 * Needs `@langchain/core` (v1).
 */
import { CallbackManager, parseCallbackConfigArg } from '@langchain/core/callbacks/manager';
import { ToolMessage } from '@langchain/core/messages';
import { StructuredTool, type ToolRunnableConfig } from '@langchain/core/tools';

import { ApprovalMemory, modelToolNames, newRunId, resultSummary } from './adapter.js';
import type { ToolgateClient } from './client.js';
import type { ToolDefinition, ToolList } from './models.js';

export interface LangChainToolsOptions {
  /** The run these calls belong to (default: the LangGraph thread_id, else one id per toolset). */
  runId?: string;
  timeoutMs?: number;
  names?: string[];
}

interface ToolsetState {
  client: ToolgateClient;
  catalogRevision: string;
  runId?: string;
  defaultRunId: string;
  timeoutMs?: number;
  memory: ApprovalMemory;
}

type AnyConfig = ToolRunnableConfig & { toolCall?: { id?: string } };

/** One toolgate tool as a LangChain tool; calls go through the sidecar. */
export class ToolgateTool extends StructuredTool {
  name: string;
  description: string;
  // The visible JSON Schema; LangChain converts it for the model's bindTools.
  schema: Record<string, unknown>;

  constructor(
    modelName: string,
    readonly definition: ToolDefinition,
    private readonly toolset: ToolsetState,
  ) {
    super();
    this.name = modelName;
    this.description = definition.description;
    this.schema = definition.inputSchema;
  }

  static lc_name(): string {
    return 'ToolgateTool';
  }

  /** StructuredTool.call without the client-side schema check (the sidecar is the judge). */
  override async call(arg: unknown, configArg?: unknown): Promise<any> {
    const isToolCall = typeof arg === 'object' && arg !== null && (arg as { type?: string }).type === 'tool_call';
    const input = isToolCall ? (arg as { args: unknown }).args : arg;
    const config = parseCallbackConfigArg(configArg as never) as AnyConfig;
    const toolCallId = isToolCall ? (arg as { id?: string }).id : config.toolCall?.id;
    const callbacks = CallbackManager.configure(config.callbacks, this.callbacks, config.tags, this.tags, config.metadata, this.metadata, {
      verbose: this.verbose,
    });
    const runManager = await callbacks?.handleToolStart(
      this.toJSON(),
      JSON.stringify(input),
      config.runId,
      undefined,
      undefined,
      undefined,
      config.runName,
      toolCallId,
    );
    try {
      const output = await this.run(input, toolCallId, config);
      await runManager?.handleToolEnd(output);
      return output;
    } catch (error) {
      await runManager?.handleToolError(error);
      throw error;
    }
  }

  protected async _call(): Promise<string> {
    throw new Error('unreachable: ToolgateTool.call runs the call itself');
  }

  private async run(input: unknown, toolCallId: string | undefined, config: AnyConfig): Promise<ToolMessage | string> {
    const threadId = config.configurable?.thread_id;
    const runId = this.toolset.runId ?? (threadId !== undefined && threadId !== '' ? String(threadId) : this.toolset.defaultRunId);
    const step = config.metadata?.langgraph_step;
    const args = typeof input === 'string' ? input : ((input ?? {}) as Record<string, unknown>);
    const key = ApprovalMemory.key(runId, this.definition.name, args);
    const result = await this.toolset.client.execute(
      { name: this.definition.name, arguments: args, callId: toolCallId ?? '', approvalId: this.toolset.memory.approvalFor(key) },
      undefined,
      {
        runId,
        step: typeof step === 'number' && step >= 0 ? step : 0,
        catalogRevision: this.toolset.catalogRevision,
        timeoutMs: this.toolset.timeoutMs,
        signal: config.signal,
      },
    );
    this.toolset.memory.record(key, result);
    if (!toolCallId) return result.modelText;
    return new ToolMessage({
      content: result.modelText,
      tool_call_id: toolCallId,
      name: this.name,
      status: result.ok ? 'success' : 'error',
      artifact: resultSummary(result),
    });
  }
}

/** LangChain tools for `list` (a ListTools answer), calling through `client`. */
export function langChainTools(list: ToolList, client: ToolgateClient, options: LangChainToolsOptions = {}): ToolgateTool[] {
  const toolset: ToolsetState = {
    client,
    catalogRevision: list.catalogRevision,
    runId: options.runId,
    defaultRunId: newRunId('langchain'),
    timeoutMs: options.timeoutMs,
    memory: new ApprovalMemory(),
  };
  return [...modelToolNames(list.tools)]
    .filter(([, definition]) => !options.names || options.names.includes(definition.name))
    .map(([modelName, definition]) => new ToolgateTool(modelName, definition, toolset));
}

/** ListTools, then `langChainTools`. */
export async function loadLangChainTools(client: ToolgateClient, options: LangChainToolsOptions = {}): Promise<ToolgateTool[]> {
  return langChainTools(await client.listTools({ timeoutMs: options.timeoutMs }), client, options);
}
