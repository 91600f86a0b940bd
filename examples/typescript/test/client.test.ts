/**
 * client.ts against the real toolgate binary (started here, stopped with SIGTERM at the end).
 *
 *   npm test --prefix examples/typescript     # needs target/debug/toolgate, or TOOLGATE_BIN
 */
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import { type ToolResult, ToolgateClient } from '../client.js';
import { ToolgateProcess } from './toolgate-process.js';

// The demo catalog's tools this test's identity may see: create_ticket and delete_ticket need the
// scope tickets:write, which it does not hold, so ListTools leaves them out.
const VISIBLE_TOOLS = [
  'echo',
  'query_ticket',
  'rag_search',
  'refund_order',
  'slow_task',
];

// Bounds for every test and hook, so nothing can hang the run.
const TEST_TIMEOUT_MS = 30_000;
const STARTUP_TIMEOUT_MS = 30_000;
// The demo catalog's shutdown_grace is 10 s; allow that plus some slack.
const SHUTDOWN_TIMEOUT_MS = 20_000;

/** Settles a call either way: its result, or the gRPC error it failed with. */
function settle(call: Promise<ToolResult>): Promise<{ result: ToolResult } | { error: grpc.ServiceError }> {
  return call.then(
    (result) => ({ result }),
    (error: grpc.ServiceError) => ({ error }),
  );
}

describe('toolgate through @grpc/grpc-js and @grpc/proto-loader', () => {
  let server: ToolgateProcess;
  let client: ToolgateClient;

  before(
    async () => {
      server = await ToolgateProcess.start(STARTUP_TIMEOUT_MS);
      client = new ToolgateClient(server.address, {
        tenant: 'acme',
        subject: 'node-test',
        agent: 'node-test',
        scopes: ['tickets:read'],
      });
    },
    { timeout: STARTUP_TIMEOUT_MS + 5_000 },
  );

  after(() => {
    client?.close();
    server?.kill(); // only does something if the SIGTERM test did not get to stop it
  });

  it('ListTools returns the demo tools with their schemas', { timeout: TEST_TIMEOUT_MS }, async () => {
    const { tools, catalog_revision } = await client.listTools();

    assert.deepEqual(
      tools.map((tool) => tool.name),
      VISIBLE_TOOLS,
    );
    assert.match(catalog_revision, /^[0-9a-f]{32}$/);

    const echo = tools.find((tool) => tool.name === 'echo')!;
    assert.equal(echo.risk_level, 'RISK_LEVEL_READ_ONLY');
    assert.deepEqual(JSON.parse(echo.input_schema_json).required, ['text']);

    // rag_search's tenant filter is bound by the server, so the model never sees it.
    const ragSearch = JSON.parse(tools.find((tool) => tool.name === 'rag_search')!.input_schema_json);
    assert.deepEqual(Object.keys(ragSearch.properties).sort(), ['query', 'top_k']);

    const refund = tools.find((tool) => tool.name === 'refund_order')!;
    assert.equal(refund.requires_approval, true);
    assert.equal(refund.risk_level, 'RISK_LEVEL_WRITE_CONFIRMED');
  });

  it('ExecuteTool runs echo', { timeout: TEST_TIMEOUT_MS }, async () => {
    const result = await client.executeTool(
      { call_id: 'ts-echo', name: 'echo', arguments_json: JSON.stringify({ text: 'hi from node' }) },
      { runId: 'node-test', step: 1 },
    );

    assert.equal(result.status, 'TOOL_STATUS_OK', result.error_message);
    assert.equal(result.model_text, 'hi from node');
    assert.equal(result.call_id, 'ts-echo');
    assert.equal(result.error_type, '');
  });

  it('a refusal is a ToolResult, not a gRPC error', { timeout: TEST_TIMEOUT_MS }, async () => {
    // This identity holds tickets:read only; create_ticket needs tickets:write.
    const result = await client.executeTool({
      name: 'create_ticket',
      arguments_json: JSON.stringify({ title: 'not allowed' }),
    });

    assert.equal(result.status, 'TOOL_STATUS_DENIED');
    assert.equal(result.error_type, 'scope_missing');
    assert.equal(result.refused_by, 'scopes');
    assert.match(result.model_text, /^TOOL_ERROR: \{"errorType":"scope_missing"/);
  });

  it('a call outliving the client deadline ends at the deadline', { timeout: TEST_TIMEOUT_MS }, async (t) => {
    const callId = `ts-deadline-${randomUUID()}`;

    const outcome = await settle(
      client.executeTool(
        { call_id: callId, name: 'slow_task', arguments_json: JSON.stringify({ ms: 900 }) },
        { timeoutMs: 100 },
      ),
    );

    // No timing is asserted (the machine may be busy): the audit event below says the client's
    // deadline, not the 900 ms task, ended the call.
    // toolgate stops the tool 5 ms before the client's deadline and answers with a TIMEOUT result
    // so the model still gets one; if that answer does not make it back in time, grpc-js fails the
    // call with DEADLINE_EXCEEDED. A client must handle both; which one comes is a race.
    if ('error' in outcome) {
      t.diagnostic('the client saw gRPC DEADLINE_EXCEEDED');
      assert.equal(outcome.error.code, grpc.status.DEADLINE_EXCEEDED, outcome.error.message);
    } else {
      const { result } = outcome;
      t.diagnostic(`the client saw a ${result.status} result`);
      assert.equal(result.status, 'TOOL_STATUS_TIMEOUT', result.model_text);
      assert.equal(result.error_type, 'timeout');
      assert.match(result.error_message, /client's deadline/);
      assert.equal(result.retryable, true, 'slow_task is read-only, so a timeout is retryable');
    }

    // Either way the server gave up on the call at the deadline, and audited it.
    const event = await server.waitForAuditEvent((e) => e.call_id === callId);
    assert.equal(event.tool, 'slow_task');
    assert.equal(event.status, 'TIMEOUT');
    assert.equal(event.error_type, 'timeout');
    assert.match(String(event.reason), /client's deadline/);
  });

  it('a cancelled call is stopped and audited as CANCELLED', { timeout: TEST_TIMEOUT_MS }, async () => {
    const callId = `ts-cancel-${randomUUID()}`;
    const controller = new AbortController();

    const call = settle(
      client.executeTool(
        { call_id: callId, name: 'slow_task', arguments_json: JSON.stringify({ ms: 900 }) },
        { signal: controller.signal, timeoutMs: 10_000 },
      ),
    );
    // Cancel once the server has started executing it (its debug log says so), not after a guess.
    await server.waitForExecuting(callId);
    controller.abort();

    const outcome = await call;
    assert.ok('error' in outcome, `expected a cancelled call, got ${JSON.stringify(outcome)}`);
    assert.equal(outcome.error.code, grpc.status.CANCELLED, outcome.error.message);

    const event = await server.waitForAuditEvent((e) => e.call_id === callId);
    assert.equal(event.tool, 'slow_task');
    assert.equal(event.status, 'CANCELLED');
    assert.equal(event.error_type, 'cancelled');
    assert.equal(event.refused_by, 'execute', 'it was cancelled while running, not refused earlier');
  });

  it('the server exits 0 on SIGTERM', { timeout: SHUTDOWN_TIMEOUT_MS + 5_000 }, async () => {
    client.close();
    const exit = await server.stop(SHUTDOWN_TIMEOUT_MS);
    assert.deepEqual(exit, { code: 0, signal: null }, server.stderrText());
  });
});
