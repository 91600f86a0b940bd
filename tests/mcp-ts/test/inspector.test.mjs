/**
 * The MCP door with the MCP Inspector's CLI (@modelcontextprotocol/inspector `--cli`), run
 * non-interactively as a person or a script would: `--transport http`, the dev identity as
 * `--header`s, `--format json`. Its HOME is a fresh directory, so nothing stored by an earlier
 * run (catalog, OAuth tokens) takes part.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

import { serverForThisFile, startRecorder } from './toolgate.mjs';

const server = serverForThisFile();

const INSPECTOR = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  '..', 'node_modules', '@modelcontextprotocol', 'inspector', 'clients', 'launcher', 'build', 'index.js',
);
const home = mkdtempSync(path.join(tmpdir(), 'toolgate-inspector-'));
after(() => rmSync(home, { recursive: true, force: true }));

/** `inspector --cli URL --transport http --format json ...args` with the caller's headers: its exit code and output. */
function inspector(url, headers, args) {
  const headerArgs = Object.entries(headers).flatMap(([name, value]) => ['--header', `${name}: ${value}`]);
  const argv = [INSPECTOR, '--cli', url, '--transport', 'http', ...headerArgs, '--format', 'json', ...args];
  return new Promise((resolve) => {
    execFile(process.execPath, argv, { timeout: 60_000, env: { ...process.env, HOME: home } }, (error, stdout, stderr) => {
      resolve({ code: error ? error.code : 0, stdout, stderr, json: stdout.trim() ? JSON.parse(stdout) : undefined });
    });
  });
}

const acme = (subject) => ({ 'x-toolgate-tenant': 'acme', 'x-toolgate-subject': subject });

describe('the MCP Inspector CLI', () => {
  it('--method tools/list prints the tools the demo lets the caller see', async () => {
    const run = await inspector(server().mcpUrl, acme('inspector'), ['--method', 'tools/list']);
    assert.equal(run.code, 0, run.stderr);
    const tools = Object.fromEntries(run.json.result.tools.map((tool) => [tool.name, tool]));
    assert.deepEqual(Object.keys(tools).sort(), ['echo', 'rag_search', 'refund_order', 'slow_task']);
    assert.deepEqual(tools.echo.inputSchema.properties, { text: { type: 'string', description: 'The text to return.' } });
    assert.deepEqual(Object.keys(tools.rag_search.inputSchema.properties), ['query', 'top_k']);

    const scoped = await inspector(server().mcpUrl, { ...acme('inspector'), 'x-toolgate-scopes': 'tickets:read tickets:write' }, ['--method', 'tools/list']);
    assert.equal(scoped.code, 0, scoped.stderr);
    assert.deepEqual(scoped.json.result.tools.map((tool) => tool.name).sort(), [
      'create_ticket', 'delete_ticket', 'echo', 'query_ticket', 'rag_search', 'refund_order', 'slow_task',
    ]);
  });

  it('--method tools/call --tool-name echo --tool-arg text=hi runs echo through the sidecar', async () => {
    const run = await inspector(server().mcpUrl, acme('inspector-echo'), ['--method', 'tools/call', '--tool-name', 'echo', '--tool-arg', 'text=hi']);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(run.json.result.content, [{ type: 'text', text: 'hi' }]);
    assert.equal(run.json.result.isError, false);
    assert.equal(run.json.result._meta['toolgate/status'], 'OK');
    const event = await server().waitForAuditEvent((e) => e.kind === 'tool_call' && e.subject === 'inspector-echo');
    assert.deepEqual([event.tool, event.door, event.status], ['echo', 'mcp', 'OK']);
  });

  it('speaks 2025-11-25 by default and 2026-07-28 with --protocol-era modern, with the same result', async () => {
    const recorder = await startRecorder(server().mcpAddress);
    try {
      const call = ['--method', 'tools/call', '--tool-name', 'echo', '--tool-arg', 'text=era'];
      const results = {};
      for (const [era, flags, version, handshake] of [
        ['legacy', [], '2025-11-25', 'initialize'],
        ['modern', ['--protocol-era', 'modern'], '2026-07-28', 'server/discover'],
      ]) {
        recorder.seen.length = 0;
        const run = await inspector(recorder.url, acme(`inspector-${era}`), [...call, ...flags]);
        assert.equal(run.code, 0, run.stderr);
        results[era] = run.json.result;
        const calls = recorder.seen.filter((request) => request.rpcMethod === 'tools/call');
        assert.deepEqual(calls.map((request) => request.version), [version], `${era}: ${JSON.stringify(recorder.seen)}`);
        assert.equal(recorder.seen[0].rpcMethod, handshake, `${era}: ${JSON.stringify(recorder.seen)}`);
      }
      assert.deepEqual(results.legacy, results.modern);
      assert.deepEqual(results.modern.content, [{ type: 'text', text: 'era' }]);
    } finally {
      await recorder.close();
    }
  });

  it('reports a refused call as the tool’s error (exit 5) with the TOOL_ERROR result', async () => {
    const headers = { ...acme('inspector-approval'), 'x-toolgate-scopes': 'tickets:write' };
    const run = await inspector(server().mcpUrl, headers, ['--method', 'tools/call', '--tool-name', 'delete_ticket', '--tool-arg', 'ticket_id=T-7']);
    assert.equal(run.code, 5, run.stderr);
    assert.equal(JSON.parse(run.stderr.trim().split('\n').at(-1)).error.code, 'tool_is_error');
    const { result } = run.json;
    assert.equal(result.isError, true);
    assert.equal(result._meta['toolgate/status'], 'APPROVAL_REQUIRED');
    assert.ok(result.content[0].text.startsWith('TOOL_ERROR: {"errorType":"approval_required"'), result.content[0].text);
    assert.ok(result.content[0].text.includes(result._meta['toolgate/approval_id']));
  });

  it('without the tenant header, fails with auth_required (exit 3)', async () => {
    const run = await inspector(server().mcpUrl, {}, ['--stored-auth-only', '--method', 'tools/list']);
    assert.equal(run.code, 3, run.stderr);
    assert.equal(run.stdout, '');
    assert.equal(JSON.parse(run.stderr.trim().split('\n').at(-1)).error.code, 'auth_required');
  });
});
