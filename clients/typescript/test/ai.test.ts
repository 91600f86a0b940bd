/** @toolgate/client/ai inside the AI SDK's own tool loop (`generateText` with `stopWhen`), with the
 * SDK's MockLanguageModelV4 instead of an LLM, against the real binary. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { type ModelMessage, generateText, stepCountIs } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';

import { loadAiTools } from '../src/ai.js';
import { TEST_TIMEOUT_MS, bob, serverForThisFile } from './support.js';

const { server, client } = serverForThisFile();

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** One scripted model response proposing tool calls: [call id, tool, arguments]. */
function calls(...proposed: [string, string, Record<string, unknown>][]) {
  return {
    content: proposed.map(([toolCallId, toolName, input]) => ({ type: 'tool-call' as const, toolCallId, toolName, input: JSON.stringify(input) })),
    finishReason: { unified: 'tool-calls' as const, raw: undefined },
    usage,
    warnings: [],
  };
}

function says(text: string) {
  return { content: [{ type: 'text' as const, text }], finishReason: { unified: 'stop' as const, raw: undefined }, usage, warnings: [] };
}

/** Tool outputs by call id, across every step of a generateText result. */
function outputs(result: { steps: { toolResults: { toolCallId: string; output: unknown }[] }[] }): Record<string, string> {
  return Object.fromEntries(result.steps.flatMap((step) => step.toolResults.map((r) => [r.toolCallId, r.output as string])));
}

/** The conversation a generateText result added, every step's messages in order. */
function transcript(result: { steps: { response: { messages: ModelMessage[] } }[] }): ModelMessage[] {
  return result.steps.flatMap((step) => step.response.messages);
}

const REFUND = { order_id: 'A-1001', amount_cents: 2500 };

describe('AI SDK tools', () => {
  it('run in generateText’s loop: tenant binding, a refusal, an approval round trip', { timeout: TEST_TIMEOUT_MS }, async () => {
    const model = new MockLanguageModelV4({
      doGenerate: [
        calls(['s1', 'rag_search', { query: 'refund policy' }], ['s2', 'rag_search', { query: 'refund', filter: { tenant: 'globex' } }]),
        calls(['r1', 'refund_order', REFUND]),
        says('The refund is waiting for approval.'),
        calls(['r2', 'refund_order', REFUND]),
        says('Refunded.'),
      ],
    });
    const tools = await loadAiTools(client(), { runId: 'ai-conv-1' });

    const first = await generateText({ model, tools, stopWhen: stepCountIs(5), prompt: 'Order A-1001 arrived broken; refund it.' });
    const shown = Object.fromEntries((model.doGenerateCalls[0]!.tools ?? []).map((tool) => [tool.name, tool]));
    const rag = shown.rag_search as { inputSchema: { properties: Record<string, unknown> } };
    assert.deepEqual(Object.keys(rag.inputSchema.properties), ['query', 'top_k'], 'bound arguments are hidden');

    const out = outputs(first);
    const hits = JSON.parse(out.s1!).results as { id: string }[];
    assert.ok(hits.length && hits.every((hit) => hit.id.startsWith('acme-')), out.s1);
    assert.ok(out.s2!.startsWith('TOOL_ERROR: {"errorType":"bound_argument_override"'), out.s2);
    assert.ok(out.r1!.startsWith('TOOL_ERROR: {"errorType":"approval_required"'), out.r1);
    assert.equal(first.text, 'The refund is waiting for approval.');

    const approver = client(bob());
    const pending = [];
    for await (const approval of approver.iterApprovals()) if (approval.runId === 'ai-conv-1') pending.push(approval);
    assert.equal(pending.length, 1);
    assert.ok(out.r1!.includes(pending[0]!.approvalId));
    await approver.approve(pending[0]!.approvalId, { reason: 'manager ok' });

    const second = await generateText({
      model,
      tools,
      stopWhen: stepCountIs(5),
      messages: [{ role: 'user', content: 'Order A-1001 arrived broken; refund it.' }, ...transcript(first), { role: 'user', content: 'Approved.' }],
    });
    assert.deepEqual(JSON.parse(outputs(second).r2!), { refunded: 'A-1001', amount_cents: 2500, status: 'refunded' });
    assert.equal(second.text, 'Refunded.');

    const events = await Promise.all(['s1', 's2', 'r1', 'r2'].map((id) => server().waitForAuditEvent((e) => e.run_id === 'ai-conv-1' && e.call_id === id)));
    const [s1, s2, r1, r2] = events;
    assert.deepEqual([s1!.step, s2!.step, r1!.step], [1, 1, 2], 'step = model responses so far');
    assert.deepEqual([r2!.status, r2!.approval_id], ['OK', pending[0]!.approvalId]);
  });
});
