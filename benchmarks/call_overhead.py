"""The fixed Redis cost of one ftlayer script call, beside a bare EVALSHA.

Every shard script runs the shared prelude (lua/core/*.lua with the constants of
ftlayer.limits) before its own body. Run by EVALSHA the prelude is built anew per call (it
defines the helpers, then ``begin`` reads the clock and makes the call's tables): that is
paid per call, whatever the call carries, so it is what small flushes and the batch scope's
per-batch calls cost beyond their records. Run as a Redis 7 function (ftlayer/scripts.py)
the prelude is built once at FUNCTION LOAD and a call pays only ``begin``. Measured server
side (INFO commandstats) over pipelined calls: a bare ``return 0``, the prelude and
``begin`` with an empty body, the same two as functions (Redis 7 only), and the ceiling of a
pipelined ``SET`` on the same server.

    python -m benchmarks.call_overhead [--calls 20000] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import redis

from benchmarks._common import machine, parse_args, redis_for_benchmark, save, server_usec
from ftlayer.keys import Keyspace
from ftlayer.scripts import script_source


def _usec_per_call(client: Any, command: str, send: Any, calls: int) -> float:
    before = server_usec(client, command)
    pipe = client.pipeline(transaction=False)
    for _ in range(calls):
        send(pipe)
    pipe.execute()
    after = server_usec(client, command)
    return (after[1] - before[1]) / max(1, after[0] - before[0])


def run(client: Any, calls: int) -> dict[str, Any]:
    keys = list(Keyspace("overhead", 1)[0].script_keys)
    prelude = script_source("fail").split("begin(KEYS)\n")[0]  # every shard script's start
    bare = client.register_script("return 0")
    full = client.register_script(prelude + "begin(KEYS)\nreturn 0")
    out: dict[str, Any] = {"machine": machine(), "calls": calls,
                           "redis_version": client.info("server")["redis_version"]}  # fmt: skip
    for name, script in (("bare", bare), ("prelude", full)):
        script(keys=keys, args=[])  # loaded
        out[f"redis_usec_per_call_{name}"] = round(
            _usec_per_call(
                client, "evalsha", lambda p, s=script: s(keys=keys, args=[], client=p), calls
            ),
            2,
        )
    out["redis_usec_per_set"] = round(
        _usec_per_call(client, "set", lambda p: p.set("overhead:k", "v"), calls), 2
    )
    out["prelude_usec_per_call"] = round(
        out["redis_usec_per_call_prelude"] - out["redis_usec_per_call_bare"], 2
    )
    out.update(_functions(client, keys, prelude, calls))
    client.delete("overhead:k")
    return out


def _functions(client: Any, keys: list[str], prelude: str, calls: int) -> dict[str, Any]:
    """The same as a function library, where the server has functions (else nothing)."""
    library = (
        "#!lua name=ftlayer_overhead\n" + prelude
        + "redis.register_function('ftlayer_overhead_bare', function(KEYS, ARGV) return 0 end)\n"
        + "redis.register_function('ftlayer_overhead_begin', function(KEYS, ARGV)\n"
        + "begin(KEYS)\nreturn 0\nend)\n"
    )  # fmt: skip
    try:
        client.function_load(library, replace=True)
    except redis.ResponseError:
        return {}
    out = {}
    try:
        for name in ("bare", "begin"):
            fn = f"ftlayer_overhead_{name}"
            out[f"redis_usec_per_fcall_{name}"] = round(
                _usec_per_call(client, "fcall", lambda p, f=fn: p.fcall(f, len(keys), *keys),
                               calls), 2)  # fmt: skip
    finally:
        client.function_delete("ftlayer_overhead")
    out["begin_usec_per_fcall"] = round(
        out["redis_usec_per_fcall_begin"] - out["redis_usec_per_fcall_bare"], 2
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    args = parse_args(ap, argv)
    with redis_for_benchmark(args.redis_url) as client:
        result = run(client, args.calls)
    save("call_overhead", result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"Redis {result['redis_version']}, {args.calls:,} pipelined calls each, server side")
    print(f"  EVALSHA 'return 0'                {result['redis_usec_per_call_bare']:>8} µs")
    print(f"  EVALSHA prelude + 'return 0'      {result['redis_usec_per_call_prelude']:>8} µs")
    print(f"  the prelude, per script call      {result['prelude_usec_per_call']:>8} µs")
    if "begin_usec_per_fcall" in result:
        print(f"  FCALL 'return 0'                  {result['redis_usec_per_fcall_bare']:>8} µs")
        print(f"  FCALL begin + 'return 0'          {result['redis_usec_per_fcall_begin']:>8} µs")
        print(f"  begin, per function call          {result['begin_usec_per_fcall']:>8} µs")
    else:
        print("  (no FUNCTION on this server: Redis 7 runs the scripts as a function library)")
    print(f"  SET (ceiling)                     {result['redis_usec_per_set']:>8} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
