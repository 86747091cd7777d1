// @aws-lambda-powertools/idempotency's Redis persistence layer (CachePersistenceLayer over
// @redis/client) doing idem's job: makeIdempotent around a trivial function, on ONE client
// connection with 50 calls in flight. Each call's payload {id} is its key (Powertools hashes the
// payload: md5 by default, no local cache, no payload validation).
//   new      every call a fresh key: SET NX of the in-progress record, the function, SET of the
//            result
//   replay   keys completed beforehand: each call returns the stored result
//   joiners  50 concurrent calls of one key (IdempotencyAlreadyInProgressError rejects them)
//
//   node powertools.mjs redis://HOST:PORT/DB new|replay|joiners [CALLS]
import { readFileSync } from 'node:fs';
import { createClient } from '@redis/client';
import { IdempotencyAlreadyInProgressError, IdempotencyConfig, makeIdempotent }
  from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
import { in_flight, joiners, measure, parse_args, run_id } from './common.mjs';

const { url, workload, calls } = parse_args('powertools.mjs');
const version = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
const fields = {
  library: 'powertools',
  version: version('@aws-lambda-powertools/idempotency'),
  client: `@redis/client ${version('@redis/client')}`,
  workload,
};

const client = await createClient({ url }).connect();
const persistenceStore = new CachePersistenceLayer({ client });
const config = new IdempotencyConfig({ expiresAfterSeconds: 600 });
// As inside a Lambda invocation: the in-progress record then carries its expiry (without one,
// Powertools warns on every call and treats an in-progress record as orphaned).
config.registerLambdaContext({ getRemainingTimeInMillis: () => 60_000 });
const idempotent = (fn) =>
  makeIdempotent(fn, { persistenceStore, config, keyPrefix: `powertools-bench:${run_id}` });

if (workload === 'joiners') {
  await joiners(fields, (work) => idempotent(async () => work())({ id: 'one' }),
                (error) => error instanceof IdempotencyAlreadyInProgressError);
} else {
  const call = idempotent(async (event) => ({ ok: true, id: event.id }));
  const id = (i) => `${run_id}:${i}`;
  const check = (result, i) => {
    if (result?.id !== id(i)) throw new Error(`call ${i} returned ${JSON.stringify(result)}`);
  };
  if (workload === 'replay') await in_flight(calls, async (i) => check(await call({ id: id(i) }), i));
  await measure(url, fields, calls,
                () => in_flight(calls, async (i) => check(await call({ id: id(i) }), i)));
}
await client.close();
