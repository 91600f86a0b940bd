/** ToolgateClient against the real binary: tools, calls, refusals, batches, deadlines,
 * cancellation, approvals and paging, retries, JWT identity, and typed transport errors. */
import assert from 'node:assert/strict';
import { createHmac, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { type AddressInfo, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';

import {
  CancelledError,
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  PageLimitError,
  PermissionDeniedError,
  ToolCallError,
  ToolgateClient,
  UnauthenticatedError,
  UnavailableError,
  bearerToken,
  devIdentity,
  tokenProvider,
} from '../src/index.js';
import { ToolStatus as PbToolStatus } from '../src/gen/toolgate/v1/toolgate_pb.js';
import { TEST_TIMEOUT_MS, alice, bob, serverForThisFile } from './support.js';
import { REPO_ROOT, ToolgateProcess } from './toolgate-process.js';

const t = { timeout: TEST_TIMEOUT_MS };
const { server, client } = serverForThisFile();

/** The address of a sidecar that is down: a Unix socket path in a fresh directory of ours, where
 * nothing is or will be (a TCP port probed and freed could meanwhile be taken by anyone, and
 * Node cannot hold one bound without listening). */
function downAddress(): string {
  return `unix://${path.join(mkdtempSync(path.join(tmpdir(), 'toolgate-down-')), 'absent.sock')}`;
}

describe('ToolgateClient', () => {
  it('lists the tools with typed definitions and no bound arguments', t, async () => {
    const { tools, catalogRevision } = await client().listTools();
    assert.equal(catalogRevision.length, 32);
    const byName = Object.fromEntries(tools.map((tool) => [tool.name, tool]));
    assert.deepEqual(Object.keys(byName), ['create_ticket', 'delete_ticket', 'echo', 'query_ticket', 'rag_search', 'refund_order', 'slow_task']);
    assert.deepEqual(Object.keys(byName.rag_search!.inputSchema.properties as object), ['query', 'top_k']);
    assert.equal(byName.refund_order!.riskLevel, 'WRITE_CONFIRMED');
    assert.equal(byName.refund_order!.requiresApproval, true);
  });

  it('returns OK output as modelText and refusals as results', t, async () => {
    const ok = await client().execute('echo', { text: 'héllo' }, { runId: 'ts-run', step: 1 });
    assert.deepEqual([ok.status, ok.ok, ok.modelText, ok.callId], ['OK', true, 'héllo', 'tool_step_1_0']);

    const attack = { query: 'refund', filter: { tenant: 'globex' } };
    const denied = await client().execute('rag_search', attack);
    assert.deepEqual([denied.status, denied.errorType, denied.refusedBy], ['DENIED', 'bound_argument_override', 'bind']);
    assert.ok(denied.modelText.startsWith('TOOL_ERROR: {"errorType":"bound_argument_override"'));
    await assert.rejects(client().execute('rag_search', attack, { check: true }), ToolCallError);
  });

  it('knows every status the stubs know', t, () => {
    // A proto change adding a status fails here (and in the freshness check) until models follow.
    const names = Object.keys(PbToolStatus).filter((k) => Number.isNaN(Number(k)));
    assert.ok(names.includes('APPROVAL_REQUIRED') && names.includes('STALE_CATALOG'));
  });

  it('binds rag_search to the caller’s tenant', t, async () => {
    for (const tenant of ['acme', 'globex']) {
      const result = await client(alice(tenant)).execute('rag_search', { query: 'refund policy' });
      const hits = JSON.parse(result.modelText).results as { id: string }[];
      assert.ok(hits.length && hits.every((hit) => hit.id.startsWith(`${tenant}-`)), result.modelText);
    }
  });

  it('runs a batch in order, in parallel only when asked', t, async () => {
    for (const parallel of [true, false]) {
      const runId = `ts-batch-${randomUUID()}`;
      const results = await client().executeMany(
        [0, 1, 2].map((i) => ({ name: 'slow_task', arguments: { ms: 300 }, callId: `slow${i}` })),
        { parallel, runId },
      );
      assert.deepEqual(results.map((r) => [r.callId, r.status]), [['slow0', 'OK'], ['slow1', 'OK'], ['slow2', 'OK']]);
      const events = await Promise.all([0, 1, 2].map((i) => server().waitForAuditEvent((e) => e.run_id === runId && e.call_id === `slow${i}`)));
      const intervals = events.map((e) => [Date.parse(e.time as string), Date.parse(e.time as string) + (e.duration_ms as number)] as const).sort((a, b) => a[0] - b[0]);
      if (parallel) {
        assert.ok(Math.max(...intervals.map(([s]) => s)) < Math.min(...intervals.map(([, e]) => e)), JSON.stringify(intervals));
      } else {
        for (let i = 1; i < intervals.length; i++) assert.ok(intervals[i]![0] >= intervals[i - 1]![1] - 1, JSON.stringify(intervals));
      }
    }
  });

  it('answers a tool past its timeout with a TIMEOUT result', t, async () => {
    const result = await client().execute('slow_task', { ms: 5000 }, { timeoutMs: 5000 });
    assert.deepEqual([result.status, result.retryable], ['TIMEOUT', true]);
  });

  it('gets a TIMEOUT result, not DEADLINE_EXCEEDED, when its own deadline ends the call', t, async () => {
    // slow_task's own timeout is 1 s: the client's 900 ms deadline comes first. The sidecar stops
    // the tool a tenth of the deadline early (90 ms) so that its answer arrives in time; a sidecar
    // that answered at the deadline itself would lose the race and the client would throw.
    const result = await client().execute('slow_task', { ms: 5000 }, { timeoutMs: 900 });
    assert.deepEqual([result.status, result.errorType], ['TIMEOUT', 'timeout']);
    assert.ok(result.errorMessage.includes("the client's deadline"), result.errorMessage);
  });

  it('talks to the sidecar over its Unix socket', t, async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'toolgate-unix-'));
    const socket = path.join(dir, 'toolgate.sock');
    const demo = readFileSync(path.join(REPO_ROOT, 'examples', 'demo.yaml'), 'utf8');
    assert.ok(demo.includes('  shutdown_grace: 10s\n'));
    const config = path.join(dir, 'catalog.yaml');
    writeFileSync(config, demo.replace('  shutdown_grace: 10s\n', `  shutdown_grace: 10s\n  unix_socket: ${socket}\n`));
    const unix = await ToolgateProcess.start({ args: ['--config', config] });
    const agents = [`unix://${socket}`, `unix:${socket}`].map((address) => new ToolgateClient({ address, identity: alice() }));
    try {
      for (const [n, agent] of agents.entries()) {
        const runId = `ts-unix-${n}-${randomUUID()}`;
        const result = await agent.execute('echo', { text: 'over the socket' }, { runId });
        assert.deepEqual([result.status, result.modelText], ['OK', 'over the socket']);
        assert.ok((await agent.listTools()).tools.some((tool) => tool.name === 'echo'));
        const event = await unix.waitForAuditEvent((e) => e.run_id === runId);
        assert.equal(event.status, 'OK');
      }
    } finally {
      agents.forEach((agent) => agent.close());
      assert.equal((await unix.stop()).code, 0);
    }
  });

  it('throws DeadlineExceededError when the sidecar never answers', t, async () => {
    const hung = createServer(() => {}); // accepts TCP, never speaks HTTP/2
    await new Promise<void>((resolve) => hung.listen(0, '127.0.0.1', resolve));
    const { port } = hung.address() as AddressInfo;
    const stuck = new ToolgateClient({ address: `127.0.0.1:${port}`, identity: alice(), timeoutMs: 500 });
    try {
      const error = await stuck.listTools().then(() => undefined, (e: unknown) => e);
      assert.ok(error instanceof DeadlineExceededError, String(error));
      assert.deepEqual([error.code, error.method], ['DEADLINE_EXCEEDED', 'ListTools']);
    } finally {
      stuck.close();
      hung.close();
    }
  });

  it('throws UnavailableError when the sidecar is down, and typed request errors', t, async () => {
    const down = new ToolgateClient({ address: downAddress(), identity: alice() });
    await assert.rejects(down.listTools(), (e: unknown) => e instanceof UnavailableError && e.code === 'UNAVAILABLE');
    down.close();
    await assert.rejects(client(devIdentity({ tenant: '' })).listTools(), UnauthenticatedError);
    const tooMany = Array.from({ length: 129 }, () => ({ name: 'echo', arguments: { text: 'x' } }));
    await assert.rejects(client().executeMany(tooMany), InvalidArgumentError);
    await assert.rejects(client().execute('echo', { text: 'x' }, { timeoutMs: 0 }), RangeError);
  });

  it('cancels a running call through an AbortSignal; the sidecar audits CANCELLED', t, async () => {
    const runId = `ts-cancel-${randomUUID()}`;
    const controller = new AbortController();
    const call = client().execute('slow_task', { ms: 3000 }, { runId, signal: controller.signal });
    await server().waitForCallsInFlight(1);
    controller.abort();
    await assert.rejects(call, CancelledError);
    const event = await server().waitForAuditEvent((e) => e.run_id === runId);
    assert.deepEqual([event.status, event.error_type], ['CANCELLED', 'cancelled']);
  });

  it('runs an approval round trip', t, async () => {
    const runId = `ts-approval-${randomUUID()}`;
    const args = { order_id: 'A-1001', amount_cents: 2500 };
    const first = await client().execute('refund_order', args, { runId });
    assert.equal(first.status, 'APPROVAL_REQUIRED');
    assert.ok(first.approvalId.startsWith('apr_') && first.modelText.includes(first.approvalId));

    const approver = client(bob());
    const listed = [];
    for await (const approval of approver.iterApprovals()) listed.push(approval);
    const mine = listed.find((a) => a.approvalId === first.approvalId)!;
    assert.deepEqual([mine.tool, mine.subject, mine.runId, mine.state], ['refund_order', 'alice', runId, 'PENDING']);
    assert.ok(mine.argumentsPreview.includes('"order_id":"A-1001"') && mine.argumentsJson === '');
    assert.equal((await approver.getApproval(first.approvalId)).argumentsJson, '{"amount_cents":2500,"order_id":"A-1001"}');

    await assert.rejects(client().approve(first.approvalId), PermissionDeniedError);
    const decided = await approver.approve(first.approvalId, { reason: 'customer called' });
    assert.deepEqual([decided.state, decided.decidedBy], ['APPROVED', 'bob']);
    await assert.rejects(approver.reject(first.approvalId), FailedPreconditionError);

    const again = await client().execute({ name: 'refund_order', arguments: { amount_cents: 2500, order_id: 'A-1001' }, approvalId: first.approvalId }, undefined, { runId });
    assert.equal(again.status, 'OK', again.modelText);
    assert.deepEqual(JSON.parse(again.modelText), { refunded: 'A-1001', amount_cents: 2500, status: 'refunded' });
    await assert.rejects(approver.getApproval('apr_00000000000000000000000000000000'), NotFoundError);
  });

  it('pages through approvals, bounded', t, async () => {
    const fresh = await ToolgateProcess.start();
    const requester = new ToolgateClient({ address: fresh.address, identity: alice() });
    const approver = new ToolgateClient({ address: fresh.address, identity: bob() });
    try {
      const ids = [];
      for (let n = 0; n < 5; n++) ids.push((await requester.execute('delete_ticket', { ticket_id: `T-${n}` })).approvalId);
      // Oldest first: by creation time in milliseconds, then by id. Calls made within one
      // millisecond are listed by id, not in the order they were made.
      const listed = [];
      for await (const a of approver.iterApprovals({ pageSize: 2 })) listed.push(a);
      const order = [...listed]
        .sort((a, b) => a.createdAtUnixMs - b.createdAtUnixMs || (a.approvalId < b.approvalId ? -1 : 1))
        .map((a) => a.approvalId);
      assert.deepEqual(listed.map((a) => a.approvalId), order);
      assert.deepEqual([...order].sort(), [...ids].sort());
      const created = new Map(listed.map((a) => [a.approvalId, a.createdAtUnixMs]));
      const madeAt = ids.map((id) => created.get(id) ?? -1);
      assert.deepEqual(madeAt, [...madeAt].sort((a, b) => a - b), 'made in this order');
      const first = await approver.listApprovals({ pageSize: 2 });
      assert.deepEqual(first.approvals.map((a) => a.approvalId), order.slice(0, 2));
      const second = await approver.listApprovals({ pageSize: 2, pageToken: first.nextPageToken });
      assert.deepEqual(second.approvals.map((a) => a.approvalId), order.slice(2, 4));
      await assert.rejects(async () => {
        for await (const _ of approver.iterApprovals({ pageSize: 2, maxPages: 2 }));
      }, PageLimitError);
    } finally {
      requester.close();
      approver.close();
      assert.equal((await fresh.stop()).code, 0);
    }
  });

  it('retries only what is retryable, waiting at least retry_after_ms', t, async () => {
    const fresh = await ToolgateProcess.start();
    const c = new ToolgateClient({ address: fresh.address, identity: alice() });
    try {
      for (let n = 0; n < 5; n++) await c.execute('refund_order', { order_id: `A-${n}`, amount_cents: 2500 });
      const sleeps: number[] = [];
      const sleep = async (ms: number) => void sleeps.push(ms);
      const runId = `ts-retry-${randomUUID()}`;
      const limited = await c.execute('refund_order', { order_id: 'A-9', amount_cents: 2500 }, { runId, retry: { maxAttempts: 3, maxRetryAfterMs: 120_000, sleep } });
      assert.equal(limited.status, 'RATE_LIMITED');
      assert.equal(sleeps.length, 2);
      assert.ok(sleeps.every((ms) => ms >= limited.retryAfterMs), JSON.stringify([sleeps, limited.retryAfterMs]));
      await fresh.waitForAuditEvent(() => fresh.auditEvents().filter((e) => e.run_id === runId).length === 3);

      sleeps.length = 0;
      const denied = await c.execute('rag_search', { query: 'x', filter: { tenant: 'globex' } }, { retry: { maxAttempts: 5, sleep } });
      assert.equal(denied.status, 'DENIED');
      assert.deepEqual(sleeps, [], 'a refusal that is not retryable is not retried');
    } finally {
      c.close();
      assert.equal((await fresh.stop()).code, 0);
    }

    const sleeps: number[] = [];
    const down = new ToolgateClient({ address: downAddress(), identity: alice(), retry: { maxAttempts: 4, sleep: async (ms) => void sleeps.push(ms) } });
    await assert.rejects(down.listTools(), UnavailableError);
    assert.equal(sleeps.length, 3);
    sleeps.length = 0;
    await assert.rejects(down.execute('create_ticket', { title: 't' }), UnavailableError);
    assert.deepEqual(sleeps, [], 'without an idempotency key a lost answer may hide a call that ran');
    await assert.rejects(down.execute({ name: 'create_ticket', arguments: { title: 't' }, idempotencyKey: 'k1' }), UnavailableError);
    assert.equal(sleeps.length, 3);
    // The approval reads change nothing, so they are retried; a decision is not.
    const reads: [string, () => Promise<unknown>][] = [
      ['listApprovals', () => down.listApprovals()],
      ['iterApprovals', async () => { for await (const _ of down.iterApprovals()); }],
      ['getApproval', () => down.getApproval('apr_x')],
    ];
    for (const [name, read] of reads) {
      sleeps.length = 0;
      await assert.rejects(read(), UnavailableError);
      assert.equal(sleeps.length, 3, name);
    }
    sleeps.length = 0;
    await assert.rejects(down.approve('apr_x'), UnavailableError);
    assert.deepEqual(sleeps, [], 'a decision whose answer was lost must not be sent again');
    down.close();
  });

  it('uses a JWT, and refreshes a token provider after a refusal and on schedule', t, async () => {
    const secret = 'ts-client-test-secret-of-at-least-32-bytes';
    const b64 = (value: string | Buffer) => Buffer.from(value).toString('base64url');
    const mint = (expiresIn = 300, tenant = 'acme') => {
      const head = b64(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
      const body = b64(JSON.stringify({ tenant, sub: 'alice', exp: Math.floor(Date.now() / 1000) + expiresIn }));
      return `${head}.${body}.${b64(createHmac('sha256', secret).update(`${head}.${body}`).digest())}`;
    };
    const demo = readFileSync(path.join(REPO_ROOT, 'examples', 'demo.yaml'), 'utf8');
    assert.ok(demo.includes('  dev_identity: true\n'));
    const config = path.join(mkdtempSync(path.join(tmpdir(), 'toolgate-jwt-')), 'catalog.yaml');
    // Without the demo's console: its development sign-in needs dev identity.
    const withoutConsole = demo.replace(/  console:\n(    .*\n)+/, '');
    writeFileSync(config, withoutConsole.replace('  dev_identity: true\n', '  dev_identity: false\n  jwt:\n    hs256_secret_env: TG_TS_TEST_SECRET\n'));
    const jwt = await ToolgateProcess.start({ args: ['--config', config], env: { TG_TS_TEST_SECRET: secret } });
    const made: ToolgateClient[] = [];
    const connect = (identity: ReturnType<typeof bearerToken>) => {
      const c = new ToolgateClient({ address: jwt.address, identity });
      made.push(c);
      return c;
    };
    try {
      const hits = JSON.parse((await connect(bearerToken(mint(300, 'globex'))).execute('rag_search', { query: 'refund' })).modelText).results;
      assert.ok(hits.length && hits.every((h: { id: string }) => h.id.startsWith('globex-')));
      await assert.rejects(connect(bearerToken(mint(-120))).listTools(), UnauthenticatedError);

      const tokens = [mint(-120), mint(), mint()];
      let fetched = 0;
      let now = 0;
      const provider = tokenProvider(() => tokens[fetched++]!, { refreshAfterMs: 60_000, clock: () => now });
      const c = connect(provider);
      assert.equal((await c.execute('echo', { text: 'hi' })).modelText, 'hi');
      assert.equal(fetched, 2, 'the refused token was replaced and the call repeated once');
      await c.listTools();
      assert.equal(fetched, 2, 'a fresh token is reused');
      now += 61_000;
      await c.listTools();
      assert.equal(fetched, 3, 'fetched again once refreshAfterMs passed');
    } finally {
      made.forEach((c) => c.close());
      assert.equal((await jwt.stop()).code, 0);
    }
  });
});
