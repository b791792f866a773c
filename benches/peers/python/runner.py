"""Contention runner for the python peers of lockkit's contention bench (benches/contention.rs).

Usage (through benches/peers/run):
    python runner.py <redis-py|python-redis-lock> --url URL --name NAME --workers W
        --hold-ms H --think-ms T --secs D

W threads, each with its own redis.Redis client (own connection pool), all started together,
loop until start + D: called = now; acquire (blocking, the library's default polling or wake-up,
lease 30 s); acquired = now; hold H if still before the deadline; unlocking = now; release;
record [worker, called, acquired, unlocking]; think T if still before the deadline. Prints one
line of JSON on stdout; all instants are time.monotonic_ns() nanoseconds since one origin.
"""

import argparse
import json
import sys
import threading
import time
from importlib.metadata import version

import redis

LEASE_S = 30

ORIGIN = time.monotonic_ns()


def now() -> int:
    """Nanoseconds since this process's origin, on the monotonic clock."""
    return time.monotonic_ns() - ORIGIN


def redis_py_locker(client: redis.Redis, name: str):
    """redis-py's Lock with its defaults (polls every 100 ms), waiting without bound."""

    def acquire():
        lock = client.lock(name, timeout=LEASE_S)
        if not lock.acquire(blocking=True):
            raise RuntimeError("acquire returned False")
        return lock.release

    return acquire


def python_redis_lock_locker(client: redis.Redis, name: str):
    """python-redis-lock's Lock (SET NX, then BLPOP on a signal list), defaults, no renewal."""
    import redis_lock

    def acquire():
        lock = redis_lock.Lock(client, name, expire=LEASE_S)
        if not lock.acquire(blocking=True):
            raise RuntimeError("acquire returned False")
        return lock.release

    return acquire


PEERS = {
    "redis-py": (redis_py_locker, "redis"),
    "python-redis-lock": (python_redis_lock_locker, "python-redis-lock"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--hold-ms", type=float, required=True)
    parser.add_argument("--think-ms", type=float, required=True)
    parser.add_argument("--secs", type=float, required=True)
    args = parser.parse_args()

    make, package = PEERS[args.peer]
    clients = [redis.Redis.from_url(args.url) for _ in range(args.workers)]
    for client in clients:
        client.ping()
    hold = args.hold_ms / 1e3
    think = args.think_ms / 1e3
    barrier = threading.Barrier(args.workers + 1)
    events: list[list[int]] = []
    errors = [0]
    guard = threading.Lock()
    window = {}

    def worker(index: int) -> None:
        acquire = make(clients[index], args.name)
        mine = []
        barrier.wait()
        deadline = window["deadline"]
        while now() < deadline:
            called = now()
            try:
                release = acquire()
            except Exception as err:  # noqa: BLE001 - counted and reported
                with guard:
                    errors[0] += 1
                print(f"{args.peer} worker {index}: acquire failed: {err}", file=sys.stderr)
                continue
            acquired = now()
            if acquired < deadline and hold > 0:
                time.sleep(hold)
            unlocking = now()
            try:
                release()
            except Exception as err:  # noqa: BLE001 - counted and reported
                with guard:
                    errors[0] += 1
                print(f"{args.peer} worker {index}: release failed: {err}", file=sys.stderr)
            mine.append([index, called, acquired, unlocking])
            if think > 0 and now() < deadline:
                time.sleep(think)
        with guard:
            events.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.workers)]
    for thread in threads:
        thread.start()
    start = now()
    window["deadline"] = start + round(args.secs * 1e9)
    barrier.wait()
    for thread in threads:
        thread.join()
    for client in clients:
        client.close()
    out = {
        "peer": args.peer,
        "version": version(package),
        "workers": args.workers,
        "start_ns": start,
        "deadline_ns": window["deadline"],
        "events": events,
        "errors": errors[0],
    }
    sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
