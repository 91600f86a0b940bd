/**
 * The MCP door with the Vercel AI SDK's MCP client (@ai-sdk/mcp): its tools in generateText's own
 * tool loop, driven by a scripted model (ai/test's MockLanguageModelV4) instead of an LLM. The
 * model's second turn answers from the tool result it was given, so the final text holds the
 * echo only if the call went through the sidecar and back.
 */
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';

import { createMCPClient } from '@ai-sdk/mcp';
import { generateText, stepCountIs } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';

import { identity, serverForThisFile } from './toolgate.mjs';

const server = serverForThisFile();

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A model turn proposing one tool call. */
function proposes(toolCallId, toolName, input) {
  return {
    content: [{ type: 'tool-call', toolCallId, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: 'tool-calls', raw: undefined },
    usage,
    warnings: [],
  };
}

/** A model turn saying `text` and stopping. */
function says(text) {
  return { content: [{ type: 'text', text }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] };
}

/** The tool results the model was given in its prompt, by call id: what it can read of them. */
function toolResultsIn(prompt) {
  return Object.fromEntries(
    prompt
      .filter((message) => message.role === 'tool')
      .flatMap((message) => message.content)
      .filter((part) => part.type === 'tool-result')
      .map((part) => [part.toolCallId, part.output]),
  );
}

/** The text of a tool result as the model reads it (the AI SDK gives an MCP result's content). */
function textOf(output) {
  assert.equal(output.type, 'content', JSON.stringify(output));
  return output.value.filter((part) => part.type === 'text').map((part) => part.text).join('');
}

describe('the AI SDK MCP client', () => {
  it('runs echo in generateText’s tool loop through the sidecar (2026-07-28)', async () => {
    const text = `hello from the model ${randomUUID()}`;
    const subject = `ai-sdk-${randomUUID()}`;
    const client = await createMCPClient({ transport: { type: 'http', url: server().mcpUrl, headers: identity({ subject }) } });
    try {
      assert.equal(client.initializeResult.protocolVersion, '2026-07-28');
      assert.equal(client.serverInfo.name, 'toolgate');
      const tools = await client.tools();
      assert.deepEqual(Object.keys(tools).sort(), ['echo', 'rag_search', 'refund_order', 'slow_task']);

      const model = new MockLanguageModelV4({
        doGenerate: async (options) => {
          const results = toolResultsIn(options.prompt);
          if (!('e1' in results)) return proposes('e1', 'echo', { text });
          return says(`The tool said: ${textOf(results.e1)}`);
        },
      });
      const result = await generateText({ model, tools, stopWhen: stepCountIs(4), prompt: 'Repeat after me.' });

      assert.equal(result.text, `The tool said: ${text}`);
      assert.equal(model.doGenerateCalls.length, 2);
      // What the model was shown of echo is the door's tools/list.
      const shown = model.doGenerateCalls[0].tools.find((tool) => tool.name === 'echo');
      assert.equal(shown.description, 'Returns the given text unchanged.');
      assert.deepEqual(shown.inputSchema.required, ['text']);
      const [call] = result.steps[0].toolResults;
      assert.equal(call.output.isError, false);
      assert.equal(call.output._meta['toolgate/status'], 'OK');
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.kind === 'tool_call' && e.subject === subject);
    assert.deepEqual([event.tool, event.door, event.tenant, event.status], ['echo', 'mcp', 'acme', 'OK']);
    assert.equal(event.arguments_sha256, createHash('sha256').update(JSON.stringify({ text })).digest('hex'));
  });

  it('gives the model the TOOL_ERROR text of a refused call', async () => {
    const subject = `ai-sdk-${randomUUID()}`;
    const client = await createMCPClient({ transport: { type: 'http', url: server().mcpUrl, headers: identity({ subject }) } });
    try {
      const tools = await client.tools();
      let seen;
      const model = new MockLanguageModelV4({
        doGenerate: async (options) => {
          const results = toolResultsIn(options.prompt);
          if (!('r1' in results)) return proposes('r1', 'refund_order', { order_id: 'A-1', amount_cents: 2500 });
          seen = textOf(results.r1);
          return says('The refund needs an approval.');
        },
      });
      const result = await generateText({ model, tools, stopWhen: stepCountIs(4), prompt: 'Refund order A-1.' });
      assert.equal(result.text, 'The refund needs an approval.');
      assert.ok(seen.startsWith('TOOL_ERROR: {"errorType":"approval_required"'), seen);
      assert.equal(result.steps[0].toolResults[0].output.isError, true);
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.kind === 'tool_call' && e.subject === subject);
    assert.deepEqual([event.tool, event.door, event.status], ['refund_order', 'mcp', 'APPROVAL_REQUIRED']);
  });
});
