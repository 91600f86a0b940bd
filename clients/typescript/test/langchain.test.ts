/** @toolgate/client/langchain inside LangChain's own agent loop (`createAgent`, LangGraph), with
 * LangChain's fake chat model (`fakeModel` from @langchain/core/testing), against the real binary. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages';
import { fakeModel } from '@langchain/core/testing';
import { convertToOpenAITool } from '@langchain/core/utils/function_calling';
import { MemorySaver } from '@langchain/langgraph';
import { createAgent } from 'langchain';

import { loadLangChainTools } from '../src/langchain.js';
import { TEST_TIMEOUT_MS, alice, bob, serverForThisFile } from './support.js';

const { server, client } = serverForThisFile();
const REFUND = { order_id: 'A-1001', amount_cents: 2500 };

function toolMessages(messages: unknown[]): Record<string, ToolMessage> {
  return Object.fromEntries(messages.filter((m): m is ToolMessage => m instanceof ToolMessage).map((m) => [m.tool_call_id, m]));
}

describe('LangChain.js tools', () => {
  it('run in createAgent’s loop: tenant binding, a refusal, an approval round trip', { timeout: TEST_TIMEOUT_MS }, async () => {
    const model = fakeModel()
      .respondWithTools([
        { id: 'c_search', name: 'rag_search', args: { query: 'refund policy' } },
        { id: 'c_attack', name: 'rag_search', args: { query: 'refund', filter: { tenant: 'globex' } } },
      ])
      .respondWithTools([{ id: 'c_refund', name: 'refund_order', args: REFUND }])
      .respond(new AIMessage("The refund needs a manager's approval."))
      .respondWithTools([{ id: 'c_refund_again', name: 'refund_order', args: REFUND }])
      .respond(new AIMessage('Refunded.'));
    // What a real chat model sends its API: the tools as OpenAI functions (the fake keeps no copy).
    const shown: ReturnType<typeof convertToOpenAITool>[] = [];
    const bind = model.bindTools.bind(model);
    model.bindTools = (tools) => {
      shown.splice(0, shown.length, ...tools.map((tool) => convertToOpenAITool(tool as never)));
      return bind(tools);
    };
    const agent = createAgent({ model, tools: await loadLangChainTools(client()), checkpointer: new MemorySaver() });
    const thread = { configurable: { thread_id: 'lcjs-thread-1' } };

    const first = await agent.invoke({ messages: [new HumanMessage('Order A-1001 arrived broken; refund it.')] }, thread);
    const rag = shown.find((tool) => tool.function.name === 'rag_search');
    assert.ok(rag, JSON.stringify(shown));
    assert.deepEqual(Object.keys((rag.function.parameters as { properties: object }).properties), ['query', 'top_k'], 'bound arguments are hidden');

    const messages = toolMessages(first.messages);
    const hits = JSON.parse(messages.c_search!.content as string).results as { id: string }[];
    assert.ok(hits.length && hits.every((hit) => hit.id.startsWith('acme-')));
    assert.equal(messages.c_attack!.status, 'error');
    assert.ok((messages.c_attack!.content as string).startsWith('TOOL_ERROR: {"errorType":"bound_argument_override"'));
    const refund = messages.c_refund!;
    assert.equal(refund.status, 'error');
    const artifact = refund.artifact as { status: string; approvalId: string };
    assert.equal(artifact.status, 'APPROVAL_REQUIRED');
    assert.ok((refund.content as string).includes(artifact.approvalId));

    await client(bob()).approve(artifact.approvalId, { reason: 'manager ok' });
    const second = await agent.invoke({ messages: [new HumanMessage('Approved, go ahead.')] }, thread);
    const done = toolMessages(second.messages).c_refund_again!;
    assert.equal(done.status, 'success', done.content as string);
    assert.deepEqual(JSON.parse(done.content as string), { refunded: 'A-1001', amount_cents: 2500, status: 'refunded' });
    assert.equal(second.messages.at(-1)!.content, 'Refunded.');

    const events = await Promise.all(
      ['c_search', 'c_attack', 'c_refund', 'c_refund_again'].map((id) => server().waitForAuditEvent((e) => e.run_id === 'lcjs-thread-1' && e.call_id === id)),
    );
    const [search, attack, refundEvent, again] = events;
    assert.ok(search!.step === attack!.step && (search!.step as number) > 0, 'LangGraph’s step');
    assert.ok((refundEvent!.step as number) > (search!.step as number));
    assert.deepEqual([again!.status, again!.approval_id], ['OK', artifact.approvalId]);
  });

  it('returns plain text when invoked without a tool call', { timeout: TEST_TIMEOUT_MS }, async () => {
    const [echo] = await loadLangChainTools(client(alice('globex')), { names: ['echo'] });
    assert.equal(await echo!.invoke({ text: 'plain' }), 'plain');
  });
});
