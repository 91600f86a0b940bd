/** Retries that can never write twice, against the real binary and a real HTTP upstream that counts
 * the writes it received: the client repeats only what the sidecar marks `retryable`, a write whose
 * upstream failed after receiving it is not, and a batch re-sends only its retryable calls. (That a
 * write whose upstream was never reached stays retryable is checked where a port can be held
 * refusing: Node cannot bind a TCP socket without listening; see the Rust and Python suites.) */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { type Server, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';

import { ToolgateClient, type RetryPolicy } from '../src/index.js';
import { TEST_TIMEOUT_MS, alice } from './support.js';
import { ToolgateProcess } from './toolgate-process.js';

const t = { timeout: TEST_TIMEOUT_MS };

/** Requests the upstream read whole, by path: each one a write that reached it. */
const received = new Map<string, number>();

/** Answers by path: `/fail500` and `/read500` with a 500, `/break` by destroying the connection
 * without an answer, anything else 200 `{}`; each request is counted once its body is read. */
function countingUpstream(): Server {
  return createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      const url = request.url ?? '';
      received.set(url, (received.get(url) ?? 0) + 1);
      if (url === '/break') {
        request.socket.destroy(); // the write happened; no answer comes
        return;
      }
      const failed = url === '/fail500' || url === '/read500';
      response.writeHead(failed ? 500 : 200, { 'content-type': 'application/json' });
      response.end(failed ? '' : '{}');
    });
  });
}

const tool = (name: string, riskLevel: string, upstream: string, toolPath: string) =>
  `  - { name: ${name}, description: d, risk_level: ${riskLevel}, timeout: 5s, executor: { http: { upstream: ${upstream}, path: "${toolPath}" } }, input_schema: { type: object } }\n`;

let upstream: Server;
let sidecar: ToolgateProcess;
const clients: ToolgateClient[] = [];

function connect(retry?: RetryPolicy): ToolgateClient {
  const client = new ToolgateClient({ address: sidecar.address, identity: alice(), ...(retry ? { retry } : {}) });
  clients.push(client);
  return client;
}

/** A retry policy that records its waits instead of waiting. */
function recorded(): { policy: RetryPolicy; sleeps: number[] } {
  const sleeps: number[] = [];
  return { policy: { maxAttempts: 3, sleep: async (ms) => void sleeps.push(ms) }, sleeps };
}

describe('retries never write twice', () => {
  before(async () => {
    upstream = countingUpstream();
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
    const { port } = upstream.address() as AddressInfo;
    const dir = mkdtempSync(path.join(tmpdir(), 'toolgate-writes-'));
    const catalog = path.join(dir, 'catalog.yaml');
    writeFileSync(
      catalog,
      'version: 1\nidentity: { dev_identity: true }\ntenants: { acme: {} }\nupstreams:\n' +
        `  svc: { url: 'http://127.0.0.1:${port}', allow_schemes: [http], allow_private_addresses: true }\n` +
        'tools:\n' +
        tool('write_500', 'write_draft', 'svc', '/fail500') +
        tool('write_broken', 'write_draft', 'svc', '/break') +
        tool('write_ok', 'write_draft', 'svc', '/ok') +
        tool('read_500', 'read_only', 'svc', '/read500'),
    );
    sidecar = await ToolgateProcess.start({ args: ['--config', catalog] });
  });
  after(async () => {
    clients.forEach((c) => c.close());
    const exit = await sidecar?.stop();
    upstream.close();
    if (exit && exit.code !== 0) throw new Error(`toolgate exited with ${exit.code ?? exit.signal}`);
  });

  for (const [name, upstreamPath] of [['write_500', '/fail500'], ['write_broken', '/break']] as const) {
    for (const key of ['', `key-${name}`]) {
      it(`sends ${name}${key ? ' with an idempotency key' : ''} once`, t, async () => {
        received.clear();
        const { policy, sleeps } = recorded();
        const client = connect(policy);
        const result = await client.execute({ name, arguments: { amount: 1 }, idempotencyKey: key || undefined });
        assert.deepEqual(Object.fromEntries(received), { [upstreamPath]: 1 }, 'one execute(), one write');
        assert.deepEqual([result.status, result.errorType, result.retryable], ['ERROR', 'upstream_unavailable', false]);
        assert.ok(result.modelText.includes('outcome is unknown'), result.modelText);
        assert.deepEqual(sleeps, [], 'a write of unknown outcome is not retried');
        if (key) {
          // The agent repeats it itself with the same key: the stored outcome, not a new write.
          const again = await client.execute({ name, arguments: { amount: 1 }, idempotencyKey: key });
          assert.deepEqual([again.idempotentReplay, again.retryable], [true, false]);
          assert.deepEqual(Object.fromEntries(received), { [upstreamPath]: 1 });
        }
      });
    }
  }

  it('re-sends only the retryable calls of a batch', t, async () => {
    received.clear();
    const { policy, sleeps } = recorded();
    const results = await connect(policy).executeMany([
      { name: 'read_500', arguments: {}, callId: 'read' }, // retryable: a read-only tool's 500
      { name: 'write_ok', arguments: {}, callId: 'ok' },
      { name: 'write_500', arguments: {}, callId: 'write' }, // not retryable: a write of unknown outcome
    ]);
    assert.deepEqual(
      results.map((r) => [r.callId, r.status, r.retryable]),
      [
        ['read', 'ERROR', true],
        ['ok', 'OK', false],
        ['write', 'ERROR', false],
      ],
    );
    assert.equal(sleeps.length, 2);
    assert.deepEqual(Object.fromEntries(received), { '/read500': 3, '/ok': 1, '/fail500': 1 });
  });
});
