// @node-idempotency/core with its Redis storage adapter (@node-idempotency/storage-adapter-redis,
// over the `redis` 4 client) doing idem's job on ONE client connection with 50 calls in flight:
// onRequest (SET NX of the in-progress record; on a hit, GET of the record), a trivial function,
// onResponse (SET of the result). No request body, so no fingerprint.
//   new      every call a fresh key
//   replay   keys completed beforehand: onRequest returns the stored response
//   joiners  50 concurrent calls of one key (REQUEST_IN_PROGRESS rejects them; the library's
//            default, inProgressStrategy.wait = false)
//
//   node node_idempotency.mjs redis://HOST:PORT/DB new|replay|joiners [CALLS]
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Idempotency, IdempotencyError, IdempotencyErrorCodes } from '@node-idempotency/core';
import { RedisStorageAdapter } from '@node-idempotency/storage-adapter-redis';
import { in_flight, joiners, measure, parse_args, run_id } from './common.mjs';

const { url, workload, calls } = parse_args('node_idempotency.mjs');
const require = createRequire(import.meta.url);
const version = (name, from = import.meta.url) =>
  JSON.parse(readFileSync(createRequire(from).resolve(`${name}/package.json`))).version;
const fields = {
  library: 'node-idempotency',
  version: version('@node-idempotency/core'),
  client: `redis ${version('redis')} (@redis/client ${
    version('@redis/client', require.resolve('redis'))})`,
  workload,
};

const storage = new RedisStorageAdapter({ url });
await storage.connect();
const idempotency = new Idempotency(storage, { cacheKeyPrefix: `node-idempotency-bench:${run_id}`,
                                               cacheTTLMS: 600_000 });
const request = (key) => ({ headers: { 'idempotency-key': key }, path: '/bench', method: 'POST' });
// What a handler wrapped by the library does: a stored response, or run and store.
const call = async (key, fn) => {
  const req = request(key);
  const stored = await idempotency.onRequest(req);
  if (stored !== undefined) return stored.body;
  const body = await fn();
  await idempotency.onResponse(req, { body });
  return body;
};

if (workload === 'joiners') {
  await joiners(fields, (work) => call('one', work),
                (error) => error instanceof IdempotencyError &&
                  error.code === IdempotencyErrorCodes.REQUEST_IN_PROGRESS);
} else {
  const key = (i) => `${run_id}:${i}`;
  const one = async (i) => {
    const body = await call(key(i), async () => ({ ok: true, id: key(i) }));
    if (body?.id !== key(i)) throw new Error(`call ${i} returned ${JSON.stringify(body)}`);
  };
  if (workload === 'replay') await in_flight(calls, one);
  await measure(url, fields, calls, () => in_flight(calls, one));
}
await storage.disconnect();
