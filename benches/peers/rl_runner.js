// The rate limiter bench's runner for node `rate-limiter-flexible` (RateLimiterRedis on ioredis):
// benches/rate_limiter.rs runs it as `node rl_runner.js <redis url> <seconds per round>` with
// NODE_PATH at the installed packages (scripts/bench-rate-limiter installs them).
//
// Prints one JSON line per throughput row ({row, callers, rate, ping, admitted}: consume() of W
// callers on 8 ioredis clients, against PING of the same callers and clients, in interleaved
// rounds) and one for the window-edge test ({row, n, boundary_busiest}: one consume opens a
// window, n − 1 come 40 ms before one interval later and n 40 ms after it; the busiest 1 s window
// of the admitted moments, on this process's clock).
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [url, secsArg] = process.argv.slice(2);
const secs = Number(secsArg || '1');
const CLIENTS = 8;
const ROUNDS = 3;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function loop(callers, op) {
  const deadline = Date.now() + secs * 1000;
  let calls = 0;
  let admitted = 0;
  const start = process.hrtime.bigint();
  await Promise.all(Array.from({ length: callers }, async (_, i) => {
    while (Date.now() < deadline) {
      if (await op(i)) admitted += 1;
      calls += 1;
    }
  }));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  return { rate: calls / elapsed, admitted: admitted / Math.max(calls, 1) };
}

function busiest(moments, intervalMs) {
  moments.sort((a, b) => a - b);
  let best = 0;
  let start = 0;
  for (let end = 0; end < moments.length; end++) {
    while (moments[end] >= moments[start] + intervalMs) start++;
    best = Math.max(best, end - start + 1);
  }
  return best;
}

async function main() {
  const clients = [];
  for (let i = 0; i < CLIENTS; i++) {
    const c = new Redis(url, { enableAutoPipelining: false });
    await c.ping();
    clients.push(c);
  }
  const consume = (limiter, i) => limiter.consume('k', 1).then(() => true, (res) => {
    if (res instanceof Error) throw res;
    return false;
  });
  for (const callers of [16, 64]) {
    const rows = [
      { row: 'ping', op: (i) => clients[i % CLIENTS].ping().then(() => true) },
    ];
    for (const [row, points] of [['consume, every call admitted', 1e9], ['consume, most refused (100/s)', 100]]) {
      const limiters = clients.map((c) => new RateLimiterRedis({
        storeClient: c, points, duration: 1, keyPrefix: `rlflx-${callers}-${points}`,
      }));
      rows.push({ row, op: (i) => consume(limiters[i % CLIENTS], i) });
    }
    const results = rows.map(() => ({ rates: [], admitted: [] }));
    for (let r = 0; r < ROUNDS; r++) {
      for (let k = 0; k < rows.length; k++) {
        const { rate, admitted } = await loop(callers, rows[k].op);
        results[k].rates.push(rate);
        results[k].admitted.push(admitted);
      }
    }
    const mean = (v) => v.reduce((a, b) => a + b, 0) / v.length;
    const ping = mean(results[0].rates);
    for (let k = 1; k < rows.length; k++) {
      console.log(JSON.stringify({
        row: rows[k].row, callers, rate: mean(results[k].rates), ping, admitted: mean(results[k].admitted),
      }));
    }
  }
  // The window edge: limit n per second.
  const n = 100;
  const limiters = clients.map((c) => new RateLimiterRedis({
    storeClient: c, points: n, duration: 1, keyPrefix: `rlflx-edge-${Date.now()}`,
  }));
  const moments = [];
  const burst = (count) => Promise.all(Array.from({ length: count }, (_, i) => consume(limiters[i % CLIENTS], i)
    .then((ok) => { if (ok) moments.push(Number(process.hrtime.bigint() / 1000n) / 1000); })));
  const t0 = Date.now();
  await burst(1);
  await sleep(t0 + 960 - Date.now());
  await burst(n - 1);
  await sleep(t0 + 1040 - Date.now());
  await burst(n);
  console.log(JSON.stringify({ row: 'fixed window (RateLimiterRedis)', n, boundary_busiest: busiest(moments, 1000) }));
  for (const c of clients) c.disconnect();
}

main().catch((err) => { console.error(err); process.exit(1); });
