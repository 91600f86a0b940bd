/**
 * Runs the real toolgate binary for these tests: `toolgate serve` on the embedded demo catalog
 * (examples/demo.yaml) with every listener on an ephemeral loopback port. The MCP door's address
 * comes from the JSON log on stderr; the audit events (JSON lines on stdout) are kept so tests
 * can wait for them. A trimmed copy of clients/typescript/test/toolgate-process.ts (another
 * package, so not imported). Every wait here is bounded.
 */
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { existsSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const GRPC_MESSAGE = 'serving gRPC over TCP';
const MCP_MESSAGE = 'serving MCP over Streamable HTTP';
const READY_MESSAGE = 'catalog loaded; SERVING';

/**
 * The binary under test: $TOOLGATE_BIN (relative to where `npm test` was run), or
 * target/debug/toolgate (`cargo build`).
 */
export function toolgateBinary() {
  const binary = process.env.TOOLGATE_BIN
    ? path.resolve(process.env.INIT_CWD ?? process.cwd(), process.env.TOOLGATE_BIN)
    : path.join(REPO_ROOT, 'target', 'debug', 'toolgate');
  if (!existsSync(binary)) {
    throw new Error(`toolgate binary not found at ${binary}; run \`cargo build\` or set TOOLGATE_BIN`);
  }
  return binary;
}

/** Rejects with `message()` after `ms` unless `promise` settles first; never leaves a timer behind. */
export async function within(promise, ms, message) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(message())), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The environment without TOOLGATE_* and RUST_LOG, so the caller's cannot steer the binary. */
function cleanEnv() {
  return Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('TOOLGATE_') && k !== 'RUST_LOG'));
}

/** Runs `toolgate ...args` as an operator would (bounded): its exit code and output. */
export function toolgateCli(args, timeoutMs = 20_000) {
  return new Promise((resolve) => {
    execFile(toolgateBinary(), args, { cwd: REPO_ROOT, env: cleanEnv(), timeout: timeoutMs }, (error, stdout, stderr) => {
      resolve({ code: error ? error.code : 0, stdout, stderr });
    });
  });
}

export class Toolgate {
  stdoutLines = [];
  stderrLines = [];
  #lines = new EventEmitter();
  #child;
  /** host:port of the MCP door. */
  mcpAddress = '';
  /** host:port of the gRPC door (for `toolgate call --addr`). */
  grpcAddress = '';

  constructor(child) {
    this.#child = child;
    /** Settles once, when the process exits. */
    this.exited = once(child, 'exit').then(([code, signal]) => ({ code, signal }));
    createInterface({ input: child.stdout }).on('line', (line) => {
      this.stdoutLines.push(line);
      this.#lines.emit('stdout', line);
    });
    createInterface({ input: child.stderr }).on('line', (line) => {
      this.stderrLines.push(line);
      this.#lines.emit('stderr', line);
    });
  }

  /** Starts the binary; resolves once the MCP door is bound and the sidecar is SERVING. */
  static async start({ timeoutMs = 30_000 } = {}) {
    // The server must not pick up a config or a log filter from the caller's environment.
    const env = cleanEnv();
    const child = spawn(
      toolgateBinary(),
      ['serve', '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--mcp-listen', '127.0.0.1:0', '--console-listen', '127.0.0.1:0', '--log-format', 'json'],
      { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const server = new Toolgate(child);
    try {
      [server.mcpAddress, server.grpcAddress] = await within(server.#untilServing(), timeoutMs, () =>
        `toolgate did not report SERVING within ${timeoutMs} ms; stderr:\n${server.stderrText()}`,
      );
    } catch (error) {
      child.kill('SIGKILL');
      throw error;
    }
    return server;
  }

  /** The MCP endpoint. */
  get mcpUrl() {
    return `http://${this.mcpAddress}/mcp`;
  }

  stderrText() {
    return this.stderrLines.join('\n');
  }

  /** The audit events printed so far. */
  auditEvents() {
    return this.stdoutLines.flatMap((line) => {
      try {
        const event = JSON.parse(line);
        return event && typeof event === 'object' ? [event] : [];
      } catch {
        return [];
      }
    });
  }

  /** The first audit event matching `predicate`, waiting for it at most `timeoutMs`. */
  waitForAuditEvent(predicate, timeoutMs = 10_000) {
    let onLine;
    const found = new Promise((resolve) => {
      onLine = () => {
        const event = this.auditEvents().find(predicate);
        if (event) resolve(event);
      };
      this.#lines.on('stdout', onLine);
      onLine(); // it may already be there
    });
    return within(found, timeoutMs, () =>
      `no matching audit event within ${timeoutMs} ms; stdout so far:\n${this.stdoutLines.join('\n')}`,
    ).finally(() => this.#lines.off('stdout', onLine));
  }

  /** SIGTERM, then wait (bounded) for the exit; SIGKILL and throw if it does not come. */
  async stop(timeoutMs = 20_000) {
    this.#child.kill('SIGTERM');
    try {
      return await within(this.exited, timeoutMs, () =>
        `toolgate did not exit within ${timeoutMs} ms of SIGTERM; stderr:\n${this.stderrText()}`,
      );
    } catch (error) {
      this.#child.kill('SIGKILL');
      throw error;
    }
  }

  /** Reads the JSON log until the doors are bound and the sidecar SERVING; resolves with their addresses. */
  #untilServing() {
    return new Promise((resolve, reject) => {
      let address;
      let grpc;
      const onLine = (line) => {
        let fields;
        try {
          fields = JSON.parse(line).fields;
        } catch {
          return; // not a JSON log line
        }
        if (fields?.message === MCP_MESSAGE) {
          address = fields.addr;
        } else if (fields?.message === GRPC_MESSAGE) {
          grpc = fields.addr;
        } else if (fields?.message === READY_MESSAGE) {
          this.#lines.off('stderr', onLine);
          if (address && grpc) resolve([address, grpc]);
          else reject(new Error(`toolgate reported SERVING without serving MCP and gRPC over TCP:\n${this.stderrText()}`));
        }
      };
      this.#lines.on('stderr', onLine);
      // A promise settles once: after SERVING, a later exit changes nothing here.
      this.exited.then(
        ({ code, signal }) =>
          reject(new Error(`toolgate exited (${code ?? signal}) before serving; stderr:\n${this.stderrText()}`)),
        reject, // it could not be started at all
      );
    });
  }
}

/** One sidecar for the test file: started before its tests, stopped after them with exit code 0. */
export function serverForThisFile() {
  let server;
  before(async () => {
    server = await Toolgate.start();
  });
  after(async () => {
    if (!server) return; // it did not start; that failure is already reported
    const exit = await server.stop();
    assert.deepEqual(exit, { code: 0, signal: null }, `toolgate's exit after SIGTERM; stderr:\n${server.stderrText()}`);
  });
  return () => server;
}

/** The dev-identity headers of a caller (examples/demo.yaml turns dev identity on). */
export function identity({ tenant = 'acme', subject, agent, scopes } = {}) {
  const headers = { 'x-toolgate-tenant': tenant };
  if (subject) headers['x-toolgate-subject'] = subject;
  if (agent) headers['x-toolgate-agent'] = agent;
  if (scopes) headers['x-toolgate-scopes'] = scopes.join(',');
  return headers;
}

/**
 * A loopback HTTP relay in front of the door that records, for each request, the HTTP method, the
 * `MCP-Protocol-Version` header and the JSON-RPC method: what a client actually sent, for clients
 * that do not report the revision they negotiated. It forwards everything unchanged but `Host`.
 */
export async function startRecorder(target) {
  const [host, port] = target.split(':');
  const seen = [];
  const relay = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      let rpcMethod;
      try {
        rpcMethod = JSON.parse(body.toString()).method;
      } catch {
        // a GET, or not JSON
      }
      seen.push({ httpMethod: req.method, version: req.headers['mcp-protocol-version'], rpcMethod });
      const upstream = http.request(
        { host, port, path: req.url, method: req.method, headers: { ...req.headers, host: target } },
        (answer) => {
          res.writeHead(answer.statusCode, answer.headers);
          answer.pipe(res);
        },
      );
      upstream.on('error', (error) => res.destroy(error));
      upstream.end(body);
    });
  });
  relay.listen(0, '127.0.0.1');
  await once(relay, 'listening');
  return {
    url: `http://127.0.0.1:${relay.address().port}/mcp`,
    seen,
    close: () => {
      const closed = new Promise((resolve) => relay.close(resolve));
      relay.closeAllConnections();
      return closed;
    },
  };
}
