// `npm run check-generated`: regenerates toolgate.v1 from proto/ into a temporary directory and
// fails if src/gen differs, so a proto change fails CI until `npm run generate` is run (and the
// typed layer in src/models.ts follows; the build type-checks it against the new code).
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = mkdtempSync(path.join(tmpdir(), 'toolgate-ts-gen-'));

function files(dir, base = dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    return entry.isDirectory() ? files(full, base) : [path.relative(base, full)];
  });
}

try {
  execFileSync(path.join(root, 'node_modules', '.bin', 'buf'), ['generate', '../../proto', '--template', 'buf.gen.yaml', '-o', out], {
    cwd: root,
    stdio: 'inherit',
  });
  const fresh = path.join(out, 'src', 'gen');
  const current = path.join(root, 'src', 'gen');
  const names = new Set([...files(fresh), ...files(current)]);
  const stale = [...names].filter((name) => {
    try {
      return readFileSync(path.join(fresh, name), 'utf8') !== readFileSync(path.join(current, name), 'utf8');
    } catch {
      return true; // present on one side only
    }
  });
  if (stale.length) {
    console.error(`the TypeScript code generated from proto/ is stale: ${stale.join(', ')}; run \`npm run generate\` in clients/typescript`);
    process.exit(1);
  }
  console.log('TypeScript generated code is up to date with proto/');
} finally {
  rmSync(out, { recursive: true, force: true });
}
