/**
 * Vercel AI SDK adapter: toolgate's tools as AI SDK `tool()`s, for `generateText`/`streamText`.
 *
 *   const tools = await loadAiTools(client, { runId: 'conversation-1' });
 *   await generateText({ model, tools, stopWhen: stepCountIs(5), prompt: '...' });
 *
 * Each tool's input schema is the visible JSON Schema from ListTools (`jsonSchema()`, no client
 * validation: the sidecar validates and audits every call, refusals included). `execute` sends the
 * call through ExecuteTool with the AI SDK's tool call id as toolgate's call id, the toolset's run id
 * (`runId`, else one id per toolset), the step (the model responses so far, from the messages the
 * SDK passes), the catalog revision and the SDK's abort signal. It returns the result's
 * `modelText`, refusals included (approval required too), so the model reads why a call did not
 * run; it never throws for a refusal. A transport failure throws a TransportError, which the SDK
 * reports as a tool error. Approvals: the repeated call redeems the approval the toolset remembered.
 *
 * Needs the `ai` package (v7).
 */
import { type Tool, jsonSchema, tool } from 'ai';

import { ApprovalMemory, modelToolNames, newRunId } from './adapter.js';
import type { ToolgateClient } from './client.js';
import type { ToolList } from './models.js';

export interface AiToolsOptions {
  /** The run these calls belong to; keep it across the turns of one conversation. */
  runId?: string;
  /** Deadline of each call in ms (default: the client's). */
  timeoutMs?: number;
  /** Only these toolgate tool names. */
  names?: string[];
}

/** AI SDK tools for `list` (a ListTools answer), calling through `client`, keyed by model name. */
export function aiTools(list: ToolList, client: ToolgateClient, options: AiToolsOptions = {}): Record<string, Tool> {
  const memory = new ApprovalMemory();
  const runId = options.runId ?? newRunId('ai');
  const tools: Record<string, Tool> = {};
  for (const [modelName, definition] of modelToolNames(list.tools)) {
    if (options.names && !options.names.includes(definition.name)) continue;
    tools[modelName] = tool({
      description: definition.description,
      inputSchema: jsonSchema<Record<string, unknown>>(definition.inputSchema as Parameters<typeof jsonSchema>[0]),
      execute: async (input, { toolCallId, messages, abortSignal }) => {
        const key = ApprovalMemory.key(runId, definition.name, input);
        const result = await client.execute(
          { name: definition.name, arguments: input, callId: toolCallId, approvalId: memory.approvalFor(key) },
          undefined,
          {
            runId,
            step: messages.filter((m) => m.role === 'assistant').length + 1,
            catalogRevision: list.catalogRevision,
            timeoutMs: options.timeoutMs,
            signal: abortSignal,
          },
        );
        memory.record(key, result);
        return result.modelText;
      },
    });
  }
  return tools;
}

/** ListTools, then `aiTools`. */
export async function loadAiTools(client: ToolgateClient, options: AiToolsOptions = {}): Promise<Record<string, Tool>> {
  return aiTools(await client.listTools({ timeoutMs: options.timeoutMs }), client, options);
}
