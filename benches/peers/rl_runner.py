"""The rate limiter bench's runner for python `limits` (asyncio, redis-py's client).

benches/rate_limiter.rs runs it as `python rl_runner.py <redis url> <seconds per round>` with the
venv scripts/bench-rate-limiter installs. Prints one JSON line per throughput row ({row, callers,
rate, ping, admitted}: `hit()` of W callers (coroutines) on 8 storages, each its own client,
against PING of the same callers and clients, in interleaved rounds) and one per strategy for the
window-edge test ({row, n, boundary_busiest}: one hit opens a window, n - 1 come 40 ms before one
interval later and n 40 ms after it; the busiest 1 s window on this process's clock).
"""

import asyncio
import json
import sys
import time

from limits import RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import (
    FixedWindowRateLimiter,
    MovingWindowRateLimiter,
    SlidingWindowCounterRateLimiter,
)

URL, SECS = sys.argv[1], float(sys.argv[2] if len(sys.argv) > 2 else "1")
CLIENTS = 8
ROUNDS = 3
STRATEGIES = [
    ("moving window (sliding log)", MovingWindowRateLimiter),
    ("sliding window counter", SlidingWindowCounterRateLimiter),
    ("fixed window", FixedWindowRateLimiter),
]


async def loop(callers, op):
    deadline = time.monotonic() + SECS
    counts = [0, 0]

    async def caller(i):
        while time.monotonic() < deadline:
            if await op(i):
                counts[1] += 1
            counts[0] += 1

    start = time.monotonic()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.monotonic() - start
    return counts[0] / elapsed, counts[1] / max(counts[0], 1)


def busiest(moments, interval):
    moments.sort()
    best, start = 0, 0
    for end in range(len(moments)):
        while moments[end] >= moments[start] + interval:
            start += 1
        best = max(best, end - start + 1)
    return best


async def main():
    storages = [
        RedisStorage("async+" + URL, implementation="redispy", key_prefix="limits")
        for i in range(CLIENTS)
    ]
    for s in storages:
        await s.bridge.storage.ping()
    for callers in [16, 64]:
        rows = [("ping", lambda i: storages[i % CLIENTS].bridge.storage.ping())]
        for name, strategy in STRATEGIES:
            for load, per_second in [("every call admitted", 10**9), ("most refused (100/s)", 100)]:
                limiters = [strategy(s) for s in storages]
                item = RateLimitItemPerSecond(per_second)
                key = f"{name}-{callers}-{per_second}"
                rows.append(
                    (
                        f"{name}, hit, {load}",
                        lambda i, limiters=limiters, item=item, key=key: limiters[
                            i % CLIENTS
                        ].hit(item, key),
                    )
                )
        results = [([], []) for _ in rows]
        for _ in range(ROUNDS):
            for k, (_, op) in enumerate(rows):
                rate, admitted = await loop(callers, op)
                results[k][0].append(rate)
                results[k][1].append(admitted)
        ping = sum(results[0][0]) / ROUNDS
        for k in range(1, len(rows)):
            print(
                json.dumps(
                    {
                        "row": rows[k][0],
                        "callers": callers,
                        "rate": sum(results[k][0]) / ROUNDS,
                        "ping": ping,
                        "admitted": sum(results[k][1]) / ROUNDS,
                    }
                ),
                flush=True,
            )
    n = 100
    for name, strategy in STRATEGIES:
        limiters = [strategy(s) for s in storages]
        item = RateLimitItemPerSecond(n)
        key = f"edge-{name}-{time.time()}"
        moments = []

        async def one(i):
            if await limiters[i % CLIENTS].hit(item, key):
                moments.append(time.monotonic())

        async def burst(count):
            await asyncio.gather(*(one(i) for i in range(count)))

        t0 = time.monotonic()
        await burst(1)
        await asyncio.sleep(t0 + 0.96 - time.monotonic())
        await burst(n - 1)
        await asyncio.sleep(t0 + 1.04 - time.monotonic())
        await burst(n)
        print(json.dumps({"row": name, "n": n, "boundary_busiest": busiest(moments, 1.0)}), flush=True)


asyncio.run(main())
