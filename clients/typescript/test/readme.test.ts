/** The README's quick start, run as written against the real binary (only the address differs),
 * importing the built package by its name. */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, it } from 'node:test';

import { TEST_TIMEOUT_MS, serverForThisFile } from './support.js';

const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { server } = serverForThisFile();

describe('README', () => {
  it('has a ten-line quick start that runs', { timeout: TEST_TIMEOUT_MS }, async () => {
    const section = readFileSync(path.join(PACKAGE, 'README.md'), 'utf8').split('## Quick start')[1]!.split('\n## ')[0]!;
    const code = /```js\n([\s\S]*?)```/.exec(section)![1]!;
    assert.ok(code.trim().split('\n').length <= 12, 'about ten lines');
    assert.ok(code.includes("'127.0.0.1:50051'"));
    // Inside the package directory, so `@toolgate/client` resolves to this package (dist/).
    const script = path.join(PACKAGE, 'dist', 'readme-quickstart.mjs');
    writeFileSync(script, code.replace('127.0.0.1:50051', server().address));
    try {
      const { stdout } = await promisify(execFile)(process.execPath, [script], { timeout: 30_000 });
      const lines = stdout.trim().split('\n');
      assert.ok(lines[0]!.split(' ').includes('rag_search'), stdout);
      assert.ok(lines.at(-2)!.startsWith('OK {"results":[{"id":"acme-1"'), stdout);
      assert.equal(lines.at(-1), 'DENIED bound_argument_override');
    } finally {
      rmSync(script, { force: true });
    }
  });
});
