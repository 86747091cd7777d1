// What both peer drivers share: the command line, the 50-in-flight loop, the client and server
// CPU around the timed loop only, and the one JSON line each run prints.
//
//   node DRIVER.mjs REDIS_URL new|replay|joiners [CALLS]
import { createClient } from '@redis/client';

export const kInFlight = 50;

export function parse_args(name) {
  const [url, workload, calls = '20000'] = process.argv.slice(2);
  if (!url || !['new', 'replay', 'joiners'].includes(workload) || !(Number(calls) > 0)) {
    console.error(`usage: node ${name} redis://HOST:PORT/DB new|replay|joiners [CALLS]`);
    process.exit(2);
  }
  return { url, workload, calls: Number(calls) };
}

// Keys unique to this process, so runs never see one another's records.
export const run_id = `${process.pid}-${Date.now()}`;

// Calls body(i) for i in [0, calls), kInFlight at a time.
export async function in_flight(calls, body, width = kInFlight) {
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < calls; i = next++) await body(i);
  };
  await Promise.all(Array.from({ length: width }, worker));
}

function parse_info(text) {
  const fields = {};
  for (const line of text.split('\r\n')) {
    const colon = line.indexOf(':');
    if (colon > 0) fields[line.slice(0, colon)] = line.slice(colon + 1);
  }
  return fields;
}

// The server's CPU seconds (user + system) and its command counts, read on a connection of its
// own (the measured library keeps its one connection to itself). Commands a Lua script runs are
// counted under their own names too.
async function server_sample(stats) {
  const cpu = parse_info(await stats.info('cpu'));
  const commands = {};
  for (const [name, value] of Object.entries(parse_info(await stats.info('commandstats')))) {
    if (!name.startsWith('cmdstat_') || name === 'cmdstat_info') continue;
    commands[name.slice('cmdstat_'.length)] = Number(/calls=(\d+)/.exec(value)[1]);
  }
  return { cpu: Number(cpu.used_cpu_user) + Number(cpu.used_cpu_sys), commands };
}

// Runs the timed loop and prints its JSON line: calls/s, client CPU µs per call
// (process.cpuUsage, this whole process), server CPU µs per call (INFO cpu) and commands per call
// (INFO commandstats).
export async function measure(url, fields, calls, loop) {
  const stats = await createClient({ url }).connect();
  const server_before = await server_sample(stats);
  const cpu_before = process.cpuUsage();
  const start = process.hrtime.bigint();
  await loop();
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  const cpu = process.cpuUsage(cpu_before);
  const server_after = await server_sample(stats);
  await stats.close();
  const commands_per_call = {};
  for (const [name, count] of Object.entries(server_after.commands)) {
    const delta = count - (server_before.commands[name] ?? 0);
    if (delta > 0) commands_per_call[name] = Number((delta / calls).toFixed(3));
  }
  console.log(JSON.stringify({
    ...fields,
    calls,
    in_flight: kInFlight,
    calls_per_s: calls / seconds,
    client_cpu_us_per_call: (cpu.user + cpu.system) / calls,
    server_cpu_us_per_call: ((server_after.cpu - server_before.cpu) * 1e6) / calls,
    commands_per_call,
  }));
}

// 50 concurrent calls of one key whose function takes 100 ms: how many executions ran and how
// many calls were rejected as duplicates in progress (errors of any other kind fail the run).
export async function joiners(fields, call, is_rejection) {
  let executions = 0;
  let rejected = 0;
  let returned = 0;
  const work = async () => {
    ++executions;
    await new Promise((resolve) => setTimeout(resolve, 100));
    return { ok: true };
  };
  await Promise.all(Array.from({ length: kInFlight }, async () => {
    try {
      await call(work);
      ++returned;
    } catch (error) {
      if (!is_rejection(error)) throw error;
      ++rejected;
    }
  }));
  console.log(JSON.stringify({ ...fields, workload: 'joiners', calls: kInFlight, executions,
                               rejected, returned }));
}
