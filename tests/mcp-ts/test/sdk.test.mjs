/**
 * The MCP door with the official TypeScript SDK's client (@modelcontextprotocol/sdk,
 * StreamableHTTPClientTransport) and, for what the transport promises a server (401 with
 * RFC 9728 metadata, Origin refused, Mcp-Method/Mcp-Name checked against the body, notifications
 * answered 202), plain fetch. Expectations come from examples/demo.yaml, the embedded demo.
 */
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { describe, it } from 'node:test';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { identity, serverForThisFile, toolgateCli } from './toolgate.mjs';

const server = serverForThisFile();

// At 5f98402 the door reads tools/call's `_meta` from the params, where rmcp leaves nothing (it
// moves a request's `_meta` into the request context): every toolgate/* key a host sends is lost.

/** An SDK client connected to the door as `who` (closed by the caller). */
async function connect(who) {
  const transport = new StreamableHTTPClientTransport(new URL(server().mcpUrl), { requestInit: { headers: identity(who) } });
  const client = new Client({ name: 'toolgate-mcp-ts-tests', version: '0.0.0' });
  await client.connect(transport);
  return { client, transport };
}

async function toolsOf(who) {
  const { client } = await connect(who);
  try {
    return Object.fromEntries((await client.listTools()).tools.map((tool) => [tool.name, tool]));
  } finally {
    await client.close();
  }
}

/** One JSON-RPC message POSTed as a host would, with `headers` on top of the usual ones. */
async function post(message, headers) {
  const response = await fetch(server().mcpUrl, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    body: JSON.stringify(message),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await response.text();
  const json = response.headers.get('content-type')?.startsWith('application/json') ? JSON.parse(text) : undefined;
  return { status: response.status, headers: response.headers, text, json };
}

/** The audit event's `arguments_sha256` of a call whose canonical arguments are `{"text": text}`. */
function echoHash(text) {
  return createHash('sha256').update(JSON.stringify({ text })).digest('hex');
}

/**
 * Asserts that the echo of `text` never ran: an echo of `marker` sent afterwards by the same
 * caller is audited, and no audit event before it carries `text`'s arguments.
 */
async function assertNeverRan(text, who) {
  const marker = `marker-${randomUUID()}`;
  const answer = await post(
    { jsonrpc: '2.0', id: 99, method: 'tools/call', params: { name: 'echo', arguments: { text: marker } } },
    identity(who),
  );
  assert.equal(answer.status, 200, answer.text);
  await server().waitForAuditEvent((e) => e.arguments_sha256 === echoHash(marker));
  const ran = server().auditEvents().filter((e) => e.arguments_sha256 === echoHash(text));
  assert.deepEqual(ran, [], 'the refused request reached the boundary');
}

/** The JSON after `TOOL_ERROR: ` in a refused result's one text block. */
function toolError(result) {
  assert.equal(result.content.length, 1);
  const [content] = result.content;
  assert.equal(content.type, 'text');
  assert.ok(content.text.startsWith('TOOL_ERROR: {'), content.text);
  return JSON.parse(content.text.slice('TOOL_ERROR: '.length));
}

/** A 2026-07-28 tools/call of echo, its body's _meta as that revision requires. */
function modernEchoCall(text) {
  return {
    jsonrpc: '2.0',
    id: 7,
    method: 'tools/call',
    params: {
      name: 'echo',
      arguments: { text },
      _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} },
    },
  };
}

describe('the TypeScript SDK client', () => {
  it('negotiates 2025-11-25 with the door, which names itself toolgate', async () => {
    const { client, transport } = await connect({});
    try {
      assert.equal(transport.protocolVersion, '2025-11-25');
      assert.equal(client.getServerVersion()?.name, 'toolgate');
      assert.deepEqual(client.getServerCapabilities()?.tools, { listChanged: true });
    } finally {
      await client.close();
    }
  });

  it('lists the tools the demo lets the caller see, bound arguments hidden', async () => {
    // acme, no scopes: query_ticket (tickets:read), create_ticket and delete_ticket (tickets:write) hidden.
    const plain = await toolsOf({});
    assert.deepEqual(Object.keys(plain).sort(), ['echo', 'rag_search', 'refund_order', 'slow_task']);
    assert.deepEqual(plain.echo.inputSchema, {
      type: 'object',
      properties: { text: { type: 'string', description: 'The text to return.' } },
      required: ['text'],
      additionalProperties: false,
    });
    assert.deepEqual(plain.echo.annotations, { readOnlyHint: true, destructiveHint: false });
    // rag_search's filter.tenant is bound to the caller: the model is not shown `filter`.
    assert.deepEqual(Object.keys(plain.rag_search.inputSchema.properties), ['query', 'top_k']);
    assert.deepEqual(plain.rag_search.inputSchema.required, ['query']);

    const scoped = await toolsOf({ scopes: ['tickets:read', 'tickets:write'] });
    assert.deepEqual(Object.keys(scoped).sort(), ['create_ticket', 'delete_ticket', 'echo', 'query_ticket', 'rag_search', 'refund_order', 'slow_task']);
    for (const name of ['query_ticket', 'create_ticket', 'delete_ticket']) {
      assert.ok(!('tenant' in scoped[name].inputSchema.properties), `${name}'s bound tenant is hidden`);
    }
    assert.equal(scoped.delete_ticket.annotations.destructiveHint, true);
    assert.equal(scoped.delete_ticket._meta['toolgate/requires_approval'], true);

    // The support-bot agent may only use echo, rag_search, query_ticket and create_ticket.
    const bot = await toolsOf({ agent: 'support-bot', scopes: ['tickets:read', 'tickets:write'] });
    assert.deepEqual(Object.keys(bot).sort(), ['create_ticket', 'echo', 'query_ticket', 'rag_search']);
    // globex denies delete_ticket.
    const globex = await toolsOf({ tenant: 'globex', scopes: ['tickets:read', 'tickets:write'] });
    assert.ok(!('delete_ticket' in globex), Object.keys(globex).join());
    assert.ok('create_ticket' in globex);
  });

  it('calls echo: the content is the input, audited as the MCP door’s call', async () => {
    const text = `hello ${randomUUID()}`;
    const subject = 'sdk-echo';
    const { client } = await connect({ subject });
    try {
      const result = await client.callTool({ name: 'echo', arguments: { text } });
      assert.deepEqual(result.content, [{ type: 'text', text }]);
      assert.equal(result.isError, false);
      assert.equal(result._meta['toolgate/status'], 'OK');
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.kind === 'tool_call' && e.arguments_sha256 === echoHash(text));
    assert.deepEqual([event.tool, event.door, event.tenant, event.subject, event.status], ['echo', 'mcp', 'acme', subject, 'OK']);
  });

  it('passes the host’s _meta run id and step to the call (the audit event names them)', async () => {
    const runId = `sdk-run-${randomUUID()}`;
    const { client } = await connect({});
    try {
      const result = await client.callTool({ name: 'echo', arguments: { text: runId }, _meta: { 'toolgate/run_id': runId, 'toolgate/step': 3 } });
      assert.equal(result.isError, false);
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.kind === 'tool_call' && e.arguments_sha256 === echoHash(runId));
    assert.deepEqual([event.run_id, event.step], [runId, 3]);
  });

  it('gets a refusal as a result with isError and the TOOL_ERROR text', async () => {
    const { client } = await connect({ subject: 'sdk-refusal' });
    try {
      // rag_search's filter.tenant is bound to the caller; a model that sends one is refused.
      const result = await client.callTool({ name: 'rag_search', arguments: { query: 'refunds', filter: { tenant: 'globex' } } });
      assert.equal(result.isError, true);
      const error = toolError(result);
      assert.deepEqual([error.errorType, error.tool], ['bound_argument_override', 'rag_search']);
      assert.deepEqual(
        [result._meta['toolgate/status'], result._meta['toolgate/error_type'], result._meta['toolgate/refused_by']],
        ['DENIED', 'bound_argument_override', 'bind'],
      );
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.subject === 'sdk-refusal' && e.tool === 'rag_search');
    assert.deepEqual([event.door, event.status, event.refused_by], ['mcp', 'DENIED', 'bind']);
  });

  it('is refused delete_ticket without tickets:write, as the gRPC door refuses it', async () => {
    const { client } = await connect({ subject: 'sdk-no-scope' });
    let mcp;
    try {
      const result = await client.callTool({ name: 'delete_ticket', arguments: { ticket_id: 'T-1' } });
      assert.equal(result.isError, true);
      mcp = toolError(result);
      assert.equal(result._meta['toolgate/error_type'], mcp.errorType);
    } finally {
      await client.close();
    }
    // The same call through the gRPC door (`toolgate call`), the same caller.
    // It exits non-zero for a refused call, printing the result all the same.
    const { code, stdout } = await toolgateCli([
      'call', '--addr', `http://${server().grpcAddress}`, '--tenant', 'acme', '--subject', 'sdk-no-scope',
      '--args', JSON.stringify({ ticket_id: 'T-1' }), 'delete_ticket',
    ]);
    assert.notEqual(code, 0, stdout);
    const modelText = stdout.split('\n').find((line) => line.startsWith('model_text: '))?.slice('model_text: '.length);
    assert.ok(modelText, stdout);
    const grpc = toolError({ content: [{ type: 'text', text: modelText }] });
    assert.deepEqual({ ...mcp, callId: undefined }, { ...grpc, callId: undefined });
    assert.ok(['scope_missing', 'tool_not_found'].includes(mcp.errorType), mcp.errorType);
  });

  it('gets APPROVAL_REQUIRED with the approval id for delete_ticket with tickets:write', async () => {
    const { client } = await connect({ subject: 'sdk-approval', scopes: ['tickets:write'] });
    try {
      const result = await client.callTool({ name: 'delete_ticket', arguments: { ticket_id: 'T-42' } });
      assert.equal(result.isError, true);
      assert.equal(result._meta['toolgate/status'], 'APPROVAL_REQUIRED');
      const approvalId = result._meta['toolgate/approval_id'];
      assert.match(approvalId, /^apr_[0-9a-f]{32}$/);
      const error = toolError(result);
      assert.equal(error.errorType, 'approval_required');
      assert.ok(error.error.includes(approvalId), error.error);
    } finally {
      await client.close();
    }
    const event = await server().waitForAuditEvent((e) => e.subject === 'sdk-approval' && e.tool === 'delete_ticket');
    assert.deepEqual([event.status, event.door], ['APPROVAL_REQUIRED', 'mcp']);
  });

  it('redeems an approval with _meta toolgate/approval_id once another person approves it', async () => {
    const alice = { subject: 'alice', scopes: ['tickets:write'] };
    const { client } = await connect(alice);
    try {
      const created = await client.callTool({ name: 'create_ticket', arguments: { title: 'printer on fire' } });
      assert.equal(created.isError, false, JSON.stringify(created));
      const args = { ticket_id: JSON.parse(created.content[0].text).id };
      const asked = await client.callTool({ name: 'delete_ticket', arguments: args });
      assert.equal(asked._meta['toolgate/status'], 'APPROVAL_REQUIRED');
      const approvalId = asked._meta['toolgate/approval_id'];
      // bob approves it through the gRPC door, as an approver does.
      const approved = await toolgateCli([
        'approve', '--addr', `http://${server().grpcAddress}`, '--tenant', 'acme', '--subject', 'bob', '--scopes', 'toolgate:approve',
        '--reason', 'checked', approvalId,
      ]);
      assert.equal(approved.code, 0, approved.stdout + approved.stderr);
      const done = await client.callTool({ name: 'delete_ticket', arguments: args, _meta: { 'toolgate/approval_id': approvalId } });
      assert.equal(done.isError, false, JSON.stringify(done));
      assert.equal(done._meta['toolgate/status'], 'OK');
      assert.deepEqual(JSON.parse(done.content[0].text), { deleted: args.ticket_id });
      const event = await server().waitForAuditEvent((e) => e.tool === 'delete_ticket' && e.approval_id === approvalId && e.status === 'OK');
      assert.deepEqual([event.door, event.subject], ['mcp', 'alice']);
    } finally {
      await client.close();
    }
  });

  it('without a tenant: 401 with the RFC 9728 challenge, and the SDK client fails to connect', async () => {
    const answer = await post({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, {});
    assert.equal(answer.status, 401);
    const challenge = answer.headers.get('www-authenticate');
    assert.match(challenge, /^Bearer resource_metadata="http:\/\/127\.0\.0\.1:\d+\/\.well-known\/oauth-protected-resource\/mcp"$/);
    assert.equal(answer.json.error, 'unauthorized');
    // The metadata document, public, on the door's own listener.
    const metadata = await fetch(`http://${server().mcpAddress}/.well-known/oauth-protected-resource/mcp`);
    assert.equal(metadata.status, 200);
    const document = await metadata.json();
    assert.deepEqual(document.bearer_methods_supported, ['header']);
    assert.match(document.resource, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);

    const transport = new StreamableHTTPClientTransport(new URL(server().mcpUrl));
    const client = new Client({ name: 'toolgate-mcp-ts-tests', version: '0.0.0' });
    await assert.rejects(client.connect(transport), (error) => error instanceof StreamableHTTPError && error.code === 401);
    await client.close();
  });

  it('the 401 challenge and the metadata name the address the door is bound to', async () => {
    const answer = await post({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, {});
    assert.equal(
      answer.headers.get('www-authenticate'),
      `Bearer resource_metadata="http://${server().mcpAddress}/.well-known/oauth-protected-resource/mcp"`,
    );
    const document = await (await fetch(`http://${server().mcpAddress}/.well-known/oauth-protected-resource/mcp`)).json();
    assert.equal(document.resource, server().mcpUrl);
  });

  it('refuses a request with an Origin header (403) before it reaches the boundary', async () => {
    const who = { subject: 'sdk-origin' };
    const text = `from a page ${randomUUID()}`;
    const call = { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'echo', arguments: { text } } };
    const answer = await post(call, { ...identity(who), origin: 'http://page.example' });
    assert.equal(answer.status, 403, answer.text);
    await assertNeverRan(text, who);
  });

  it('refuses Mcp-Method / Mcp-Name headers that contradict the body (-32020, HTTP 400)', async () => {
    const who = { subject: 'sdk-headers' };
    const modern = { ...identity(who), 'mcp-protocol-version': '2026-07-28' };
    const matching = await post(modernEchoCall('matching'), { ...modern, 'mcp-method': 'tools/call', 'mcp-name': 'echo' });
    assert.equal(matching.status, 200, matching.text);
    assert.deepEqual(matching.json.result.content, [{ type: 'text', text: 'matching' }]);

    for (const [label, headers] of [
      ['Mcp-Method: tools/list', { 'mcp-method': 'tools/list', 'mcp-name': 'echo' }],
      ['Mcp-Name: other', { 'mcp-method': 'tools/call', 'mcp-name': 'other' }],
    ]) {
      const text = `mismatch ${randomUUID()}`;
      const answer = await post(modernEchoCall(text), { ...modern, ...headers });
      assert.equal(answer.status, 400, `${label}: ${answer.text}`);
      assert.equal(answer.json.error.code, -32020, `${label}: ${answer.text}`);
      assert.equal(answer.json.id, 7, label);
      await assertNeverRan(text, who);
    }
  });

  it('answers a notification 202 with no body', async () => {
    const initialized = await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, identity({}));
    assert.deepEqual([initialized.status, initialized.text], [202, '']);
    const cancelled = await post(
      { jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 5 } },
      { ...identity({}), 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'notifications/cancelled' },
    );
    assert.deepEqual([cancelled.status, cancelled.text], [202, '']);
  });
});
