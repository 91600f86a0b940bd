/** Shared by the tests: the demo's identities and a server per test file. */
import { after, before } from 'node:test';

import { ToolgateClient, devIdentity } from '../src/index.js';
import { ToolgateProcess } from './toolgate-process.js';

export const TEST_TIMEOUT_MS = 60_000;

export const alice = (tenant = 'acme') =>
  devIdentity({ tenant, subject: 'alice', agent: 'ts-agent', scopes: ['tickets:read', 'tickets:write'] });
export const bob = (tenant = 'acme') => devIdentity({ tenant, subject: 'bob', scopes: ['toolgate:approve'] });

/** Starts the real binary before the file's tests and checks it exits 0 on SIGTERM after them. */
export function serverForThisFile(): { server: () => ToolgateProcess; client: (identity?: ReturnType<typeof alice>) => ToolgateClient } {
  let server: ToolgateProcess | undefined;
  const clients: ToolgateClient[] = [];
  before(async () => {
    server = await ToolgateProcess.start();
  });
  after(async () => {
    clients.forEach((c) => c.close());
    const exit = await server?.stop();
    if (exit && exit.code !== 0) throw new Error(`toolgate exited with ${exit.code ?? exit.signal}`);
  });
  return {
    server: () => server!,
    client: (identity = alice()) => {
      const client = new ToolgateClient({ address: server!.address, identity });
      clients.push(client);
      return client;
    },
  };
}
