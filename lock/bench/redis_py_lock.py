"""Baseline for `cargo run --release -p lock --example bench`: redis-py's asyncio Lock.

Same workload as the Rust bench: CLIENTS tasks, each repeatedly taking a lock on a random
one of KEYS keys, holding it HOLD_MS, and releasing it, for SECONDS. Prints the figure on
its last line as `pairs/s: <number>`. Needs `pip install redis`.
"""

import argparse
import asyncio
import random
import time

import redis.asyncio as aioredis


async def client(r, keys, hold_s, stop_at, prefix, counts):
    while time.monotonic() < stop_at:
        lock = r.lock(f"{prefix}:{random.randrange(keys)}", timeout=30, blocking_timeout=10)
        if await lock.acquire():
            if hold_s:
                await asyncio.sleep(hold_s)
            await lock.release()
            counts[0] += 1


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="redis://127.0.0.1:6379")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--keys", type=int, default=10000)
    parser.add_argument("--hold-ms", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    r = aioredis.from_url(args.url, max_connections=args.clients)
    prefix = f"pybench:{random.getrandbits(32):08x}"
    counts = [0]
    started = time.monotonic()
    stop_at = started + args.seconds
    await asyncio.gather(
        *(client(r, args.keys, args.hold_ms / 1000, stop_at, prefix, counts) for _ in range(args.clients))
    )
    elapsed = time.monotonic() - started
    await r.aclose()
    print(f"pairs/s: {counts[0] / elapsed:.0f}")


asyncio.run(main())
