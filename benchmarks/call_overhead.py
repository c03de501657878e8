"""The fixed Redis cost of one ftlayer script call, beside a bare EVALSHA.

Every shard script runs the shared prelude (lua/_common.lua with the constants of
ftlayer.limits) before its own body: it reads the clock, makes the call's tables and defines
the helpers. That is paid per call, whatever the call carries, so it is what small flushes
and the batch scope's per-batch calls cost beyond their records. Measured server side
(INFO commandstats) over pipelined calls: a bare ``return 0``, the prelude with an empty
body, and the ceiling of a pipelined ``SET`` on the same server.

    python -m benchmarks.call_overhead [--calls 20000] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
from importlib.resources import files
from typing import Any

from benchmarks._common import machine, redis_for_benchmark, save, server_usec
from ftlayer.keys import Keyspace
from ftlayer.limits import lua_constants


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
    prelude = lua_constants() + (files("ftlayer") / "lua" / "_common.lua").read_text()
    bare = client.register_script("return 0")
    full = client.register_script(prelude + "\nreturn 0")
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
    client.delete("overhead:k")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
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
    print(f"  SET (ceiling)                     {result['redis_usec_per_set']:>8} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
