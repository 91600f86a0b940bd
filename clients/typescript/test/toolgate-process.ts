/**
 * Runs the real toolgate binary for the tests: `toolgate serve --listen 127.0.0.1:0 --log-format json`
 * on the embedded demo catalog (or `--config`, given in `args`). The bound address comes from its
 * JSON log on stderr; its audit events (JSON lines on stdout) are kept so tests can wait for them.
 * Every wait here is bounded.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const SERVING_ADDR_MESSAGE = 'serving gRPC over TCP';
const READY_MESSAGE = 'catalog loaded; SERVING';
const ADMIN_MESSAGE = 'serving /metrics, /healthz and /readyz';

/** One audit event as the binary prints it (the fields the tests look at). */
export interface AuditEvent {
  kind: string;
  call_id: string;
  run_id: string;
  tool: string;
  status: string;
  error_type?: string;
  reason?: string;
  [field: string]: unknown;
}

/** The binary under test: $TOOLGATE_BIN, or target/debug/toolgate (`cargo build`). */
export function toolgateBinary(): string {
  const binary = process.env.TOOLGATE_BIN
    ? path.resolve(process.env.TOOLGATE_BIN)
    : path.join(REPO_ROOT, 'target', 'debug', 'toolgate');
  if (!existsSync(binary)) {
    throw new Error(`toolgate binary not found at ${binary}; run \`cargo build\` or set TOOLGATE_BIN`);
  }
  return binary;
}

/** Rejects with `message` after `ms` unless `promise` settles first; never leaves a timer behind. */
async function within<T>(promise: Promise<T>, ms: number, message: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message())), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export class ToolgateProcess {
  readonly stdoutLines: string[] = [];
  readonly stderrLines: string[] = [];
  /** Settles once, when the process exits. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private readonly lines = new EventEmitter();
  address = '';

  private constructor(private readonly child: ChildProcess) {
    this.exited = once(child, 'exit').then(([code, signal]) => ({ code, signal }));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.stdoutLines.push(line);
      this.lines.emit('stdout', line);
    });
    createInterface({ input: child.stderr! }).on('line', (line) => {
      this.stderrLines.push(line);
      this.lines.emit('stderr', line);
    });
  }

  /** Starts the binary and resolves once it is bound and SERVING. */
  static async start(
    options: { args?: string[]; env?: Record<string, string>; timeoutMs?: number } = {},
  ): Promise<ToolgateProcess> {
    const timeoutMs = options.timeoutMs ?? 30_000;
    // The server must not pick up a config or log filter from the caller's environment.
    const env = Object.fromEntries(
      Object.entries(process.env).filter(([k]) => !k.startsWith('TOOLGATE_') && k !== 'RUST_LOG'),
    );
    const child = spawn(
      toolgateBinary(),
      ['serve', '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--mcp-listen', '127.0.0.1:0', '--console-listen', '127.0.0.1:0', '--log-format', 'json', ...(options.args ?? [])],
      { cwd: REPO_ROOT, env: { ...env, ...options.env }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const server = new ToolgateProcess(child);
    try {
      server.address = await within(server.untilServing(), timeoutMs, () =>
        `toolgate did not report SERVING within ${timeoutMs} ms; stderr:\n${server.stderrText()}`,
      );
    } catch (error) {
      child.kill('SIGKILL');
      throw error;
    }
    return server;
  }

  stderrText(): string {
    return this.stderrLines.join('\n');
  }

  /** The audit events printed so far. */
  auditEvents(): AuditEvent[] {
    return this.stdoutLines.flatMap((line) => {
      try {
        const event = JSON.parse(line);
        return event && typeof event === 'object' ? [event as AuditEvent] : [];
      } catch {
        return [];
      }
    });
  }

  /** The first audit event matching `predicate`, waiting for it at most `timeoutMs`. */
  waitForAuditEvent(predicate: (event: AuditEvent) => boolean, timeoutMs = 10_000): Promise<AuditEvent> {
    let onLine: (() => void) | undefined;
    const found = new Promise<AuditEvent>((resolve) => {
      onLine = () => {
        const event = this.auditEvents().find(predicate);
        if (event) resolve(event);
      };
      this.lines.on('stdout', onLine);
      onLine(); // it may already be there
    });
    return within(found, timeoutMs, () =>
      `no matching audit event within ${timeoutMs} ms; stdout so far:\n${this.stdoutLines.join('\n')}`,
    ).finally(() => this.lines.off('stdout', onLine!));
  }

  /** The admin endpoint's address (/metrics), from the JSON log. */
  adminAddress(): string {
    for (const line of this.stderrLines) {
      try {
        const fields = JSON.parse(line).fields;
        if (fields?.message === ADMIN_MESSAGE) return fields.addr as string;
      } catch {
        // not a JSON log line
      }
    }
    throw new Error(`no admin address in the log:\n${this.stderrText()}`);
  }

  /** Polls /metrics (bounded) until toolgate_calls_in_flight is `count`. */
  async waitForCallsInFlight(count: number, timeoutMs = 10_000): Promise<void> {
    const url = `http://${this.adminAddress()}/metrics`;
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const text = await (await fetch(url, { signal: AbortSignal.timeout(timeoutMs) })).text();
      if (text.includes(`toolgate_calls_in_flight ${count}\n`)) return;
      await new Promise((resolve) => setTimeout(resolve, 10)); // a poll interval; the condition is re-checked
    }
    throw new Error(`toolgate_calls_in_flight never reached ${count} within ${timeoutMs} ms`);
  }

  /** SIGTERM, then wait (bounded) for the exit; SIGKILL and throw if it does not come. */
  async stop(timeoutMs = 20_000): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    this.child.kill('SIGTERM');
    try {
      return await within(this.exited, timeoutMs, () =>
        `toolgate did not exit within ${timeoutMs} ms of SIGTERM; stderr:\n${this.stderrText()}`,
      );
    } catch (error) {
      this.child.kill('SIGKILL');
      throw error;
    }
  }

  /** Kills the process if it is still running (for cleanup after a failure). */
  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }

  /** Reads the JSON log until the server is bound and SERVING; resolves with the bound address. */
  private untilServing(): Promise<string> {
    return new Promise<string>((resolve, reject) => {
      let address: string | undefined;
      const onLine = (line: string) => {
        let fields: { message?: string; addr?: string } | undefined;
        try {
          fields = JSON.parse(line).fields;
        } catch {
          return; // not a JSON log line
        }
        if (fields?.message === SERVING_ADDR_MESSAGE) {
          address = fields.addr;
        } else if (fields?.message === READY_MESSAGE) {
          this.lines.off('stderr', onLine);
          if (address) resolve(address);
          else reject(new Error(`toolgate reported SERVING before its address:\n${this.stderrText()}`));
        }
      };
      this.lines.on('stderr', onLine);
      // A promise settles once: after SERVING, a later exit changes nothing here.
      this.exited.then(
        ({ code, signal }) =>
          reject(new Error(`toolgate exited (${code ?? signal}) before serving; stderr:\n${this.stderrText()}`)),
        reject, // it could not be started at all
      );
    });
  }
}
