// Contention runner for the node peers of lockkit's contention bench (benches/contention.rs).
//
// Usage (through benches/peers/run): node runner.js <redis-semaphore|redlock> --url URL
//   --name NAME --workers W --hold-ms H --think-ms T --secs D
//
// W async workers in this one process, each with its own ioredis client, all started together,
// loop until start + D: called = now; acquire (blocking, the library's default polling, lease
// 30 s); acquired = now; hold H if still before the deadline; unlocking = now; release; record
// [worker, called, acquired, unlocking]; think T if still before the deadline. Prints one line
// of JSON on stdout; all instants are process.hrtime.bigint() nanoseconds since one origin.
'use strict';

const Redis = require('ioredis');

const LEASE_MS = 30000;

function parseArgs(argv) {
  const [peer, ...rest] = argv;
  const opts = { peer };
  for (let i = 0; i < rest.length; i += 2) {
    const key = rest[i].replace(/^--/, '');
    const value = rest[i + 1];
    if (value === undefined) throw new Error(`missing value for ${rest[i]}`);
    opts[key] = value;
  }
  for (const key of ['url', 'name', 'workers', 'hold-ms', 'think-ms', 'secs']) {
    if (opts[key] === undefined) throw new Error(`missing --${key}`);
  }
  return {
    peer,
    url: opts.url,
    name: opts.name,
    workers: Number(opts.workers),
    holdMs: Number(opts['hold-ms']),
    thinkMs: Number(opts['think-ms']),
    secs: Number(opts.secs),
  };
}

const origin = process.hrtime.bigint();
const now = () => Number(process.hrtime.bigint() - origin);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One peer: a version and a factory of per-worker lockers. A locker has acquire() resolving to a
// release function, and close().
function peerOf(name) {
  if (name === 'redis-semaphore') {
    const { Mutex } = require('redis-semaphore');
    return {
      version: require('redis-semaphore/package.json').version,
      make(client, key) {
        return {
          async acquire() {
            // Library defaults (retryInterval 10 ms, refresh at 0.8 × lease) except that it waits
            // without bound, as every runner does.
            const mutex = new Mutex(client, key, {
              lockTimeout: LEASE_MS,
              acquireTimeout: Number.POSITIVE_INFINITY,
            });
            await mutex.acquire();
            return () => mutex.release();
          },
        };
      },
    };
  }
  if (name === 'redlock') {
    const Redlock = require('redlock');
    return {
      version: require('redlock/package.json').version,
      make(client, key) {
        // Library defaults (retryDelay 200 ms, jitter 100 ms) except retryCount -1: unbounded.
        const redlock = new Redlock([client], { retryCount: -1 });
        return {
          async acquire() {
            const lock = await redlock.lock(key, LEASE_MS);
            return () => lock.unlock();
          },
        };
      },
    };
  }
  throw new Error(`unknown node peer ${name}`);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const peer = peerOf(args.peer);
  const clients = [];
  for (let w = 0; w < args.workers; w += 1) {
    const client = new Redis(args.url, { lazyConnect: true, maxRetriesPerRequest: 3 });
    await client.connect();
    await client.ping();
    clients.push(client);
  }
  let errors = 0;
  const start = now();
  const deadline = start + Math.round(args.secs * 1e9);
  const worker = async (w) => {
    const locker = peer.make(clients[w], args.name);
    const events = [];
    while (now() < deadline) {
      const called = now();
      let release;
      try {
        release = await locker.acquire();
      } catch (err) {
        errors += 1;
        process.stderr.write(`${args.peer} worker ${w}: acquire failed: ${err}\n`);
        continue;
      }
      const acquired = now();
      if (acquired < deadline && args.holdMs > 0) await sleep(args.holdMs);
      const unlocking = now();
      try {
        await release();
      } catch (err) {
        errors += 1;
        process.stderr.write(`${args.peer} worker ${w}: release failed: ${err}\n`);
      }
      events.push([w, called, acquired, unlocking]);
      if (args.thinkMs > 0 && now() < deadline) await sleep(args.thinkMs);
    }
    return events;
  };
  const perWorker = await Promise.all(clients.map((_, w) => worker(w)));
  for (const client of clients) client.disconnect();
  const out = {
    peer: args.peer,
    version: peer.version,
    workers: args.workers,
    start_ns: start,
    deadline_ns: deadline,
    events: perWorker.flat(),
    errors,
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch((err) => {
  process.stderr.write(`runner failed: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
