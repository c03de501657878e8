"""Section renderers of the Redis-side benchmarks: the ack path (one server or a cluster,
and the two compared), the script prelude's cost, claims, flushes, pending-record memory,
the ack-entry layouts and rotation."""

from __future__ import annotations

from benchmarks.results_md.page import (
    Goal,
    GoalResult,
    Json,
    Page,
    common_facts,
    is_num,
    met_text,
    num,
    parse_goal,
    ratio,
)

ACK_ROWS = (
    # (field, figure, baseline field, baseline label, recorded ratio field)
    ("xor_events_per_s", "XOR events/s, per-record calls (client wall)",
     "naive_lua_events_per_s", "one EVALSHA per XOR", "ratio_vs_naive"),
    ("xor_events_per_s", "XOR events/s ÷ pipelined SET through redis-py",
     "raw_set_ops_per_s", "SETs/s", "ratio_vs_raw_set"),
    ("xor_events_per_s", "XOR events/s ÷ the server's own ceiling",
     "redis_benchmark_set_ops_per_s", "redis-benchmark SETs/s", "ratio_vs_redis_benchmark_set"),
    ("xor_events_per_s_numpy", "XOR events/s, numpy calls (`*_many`)",
     "xor_events_per_s", "per-record calls", ""),
    ("client_events_per_cpu_s", "client events per CPU-second, per-record calls",
     "naive_client_events_per_cpu_s", "one EVALSHA per XOR", ""),
    ("client_events_per_cpu_s_numpy", "client events per CPU-second, numpy calls",
     "client_events_per_cpu_s", "per-record calls", ""),
    ("redis_usec_per_event", "Redis µs per event (server, scripts)",
     "naive_redis_usec_per_event", "one EVALSHA per XOR", ""),
    ("redis_usec_per_event_numpy", "Redis µs per event, numpy calls",
     "redis_usec_per_event", "per-record calls", ""),
    ("redis_cpu_usec_per_event", "Redis CPU µs per event",
     "naive_redis_cpu_usec_per_event", "one EVALSHA per XOR", ""),
)  # fmt: skip


def ack_rows(page: Page, data: Json) -> None:
    """The ack path's headline rows; each goal in ``data["goals"]`` beside its figure."""
    goals = data.get("goals") or {}
    for key, figure, base, base_label, ratio_key in ACK_ROWS:
        if key not in data:
            continue
        goal_key = ratio_key if ratio_key in goals else key if key in goals else None
        if goal_key and goal_key in page.used_goals:
            goal_key = None  # one row per goal
        goal = page.goal_of(goal_key, ">=", goals) if goal_key else None
        recorded = goals[goal_key].get("met") if goal_key else None
        r = data.get(ratio_key) if ratio_key else ratio(data.get(key), data.get(base))
        on_ratio = goal_key is not None and goal_key == ratio_key
        page.row(figure, data[key], data.get(base), base_label, r, goal=goal,
                 goal_value=data.get(goal_key) if goal_key else None,
                 recorded_met=recorded if isinstance(recorded, bool) else None,
                 goal_on="ratio" if on_ratio else "",
                 goal_label=f"ack path: ratio to {base_label} (`{goal_key}`)" if on_ratio
                 else f"ack path: {figure}")  # fmt: skip


def sweep_table(page: Page, data: Json, title: str) -> None:
    sweep = data.get("sweep") or []
    if len(sweep) < 2:
        return
    keys = ["batch"] + sorted({k for p in sweep for k in p} - {"batch"})
    page.table(title, keys, [[num(p.get(k)) for k in keys]
                             for p in sorted(sweep, key=lambda p: p.get("batch", 0))])


def per_node_table(page: Page, data: Json, title: str) -> None:
    nodes = data.get("per_node") or []
    if len(nodes) < 2:
        return
    keys = ["node", "shards", "records", "events", "evalsha_calls", "evalsha_usec",
            "usec_per_event", "share_of_usec", "server_cpu_s"]  # fmt: skip
    page.table(title, keys, [[num(n.get(k)) for k in keys] for n in nodes])


def render_ack(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("ceiling", d.get("redis_benchmark_set_note"))
    if d.get("cluster_ceilings"):
        page.notes.append(f"Cluster ceilings: {d['cluster_ceilings']}.")
    ack_rows(page, d)
    sweep_table(page, d, "By batch size (records per task):")
    per_node_table(page, d, "Per master:")
    wall = d.get("client_wall_ns_per_record")
    if isinstance(wall, dict):
        page.table("Client wall time per record, by stage (ns):", ["stage", "ns per record"],
                   [[k, num(v)] for k, v in sorted(wall.items())])


def render_call_overhead(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.row("EVALSHA of the prelude + `return 0`", d.get("redis_usec_per_call_prelude"),
             d.get("redis_usec_per_call_bare"), "bare EVALSHA `return 0`",
             ratio(d.get("redis_usec_per_call_prelude"), d.get("redis_usec_per_call_bare")),
             unit="µs")  # fmt: skip
    page.row("the prelude, per script call (the difference)", d.get("prelude_usec_per_call"),
             unit="µs")
    if "redis_usec_per_fcall_begin" in d:
        page.row("FCALL of `begin` + `return 0` (Redis 7 function)",
                 d["redis_usec_per_fcall_begin"], d.get("redis_usec_per_fcall_bare"),
                 "bare FCALL `return 0`",
                 ratio(d["redis_usec_per_fcall_begin"], d.get("redis_usec_per_fcall_bare")),
                 unit="µs")  # fmt: skip
        page.row("`begin`, per function call (the difference)", d.get("begin_usec_per_fcall"),
                 unit="µs")
    page.row("pipelined SET (ceiling)", d.get("redis_usec_per_set"), unit="µs")


def render_claim(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("claim calls", d.get("claim_calls"))
    goal = None
    if is_num(d.get("goal_claim_records_per_s")):
        goal = Goal(">=", float(d["goal_claim_records_per_s"]))
    page.row("replays claimed per second", d.get("claim_records_per_s"),
             d.get("ceiling_lpop_records_per_s"), "LPOP of the same queue entries alone",
             d.get("ratio_to_ceiling"), goal=goal,
             goal_label="replays claimed per second")  # fmt: skip
    page.row("Redis µs per claimed record", d.get("claim_redis_usec_per_record"))
    page.row("expiry that queued them: records/s", d.get("expiry_records_per_s"))
    page.row("expiry: Redis µs per record", d.get("expiry_redis_usec_per_record"))


def render_cluster_compare(page: Page) -> None:
    d = page.data
    common_facts(page)
    if d.get("note"):
        page.notes.append(f"Note recorded with the run: {d['note']}.")
    single, clustered = d.get("single") or {}, d.get("cluster") or {}
    ratios = d.get("ratio_cluster_vs_single") or {}
    goals = clustered.get("goals") or {}
    single_goals = single.get("goals") or {}
    masters = d.get("masters", "?")
    for key in sorted(ratios):
        goal = None
        if key in goals:
            goal = parse_goal(goals[key].get("target"))
        page.row(f"`{key}`, {masters}-master cluster", clustered.get(key), single.get(key),
                 "one server", ratios[key], goal=goal,
                 goal_label=f"ack path on a {masters}-master cluster: `{key}`")  # fmt: skip
        if key in single_goals and page.rows[-1].met:
            one = parse_goal(single_goals[key].get("target"))
            met = one.holds(single.get(key)) if one else None
            page.rows[-1].met += f"; one server: {met_text(met)}"
            page.goals.append(GoalResult(page.name, f"ack path on one server: `{key}`",
                                         num(single.get(key)), str(one), met,
                                         page.date))  # fmt: skip
    per_node_table(page, clustered, f"Per master, {masters}-master cluster:")



def render_flush_cost(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.row("one flush of the XORs: client fold and pack + Redis wall", d.get("flush_total_ms"),
             unit="ms")
    page.row("client fold and pack", d.get("pack_ms"), unit="ms")
    page.row("Redis wall time of the pipelined script calls", d.get("redis_wall_ms"),
             d.get("ceiling_hset_pipeline_ms"), "as many pipelined HSETs",
             ratio(d.get("redis_wall_ms"), d.get("ceiling_hset_pipeline_ms")), unit="ms")
    page.row("Redis server time", d.get("redis_server_ms"), unit="ms")
    page.row("Redis server µs per XOR", d.get("server_usec_per_xor"))


def render_pending_memory(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("stored header bytes", d.get("stored_header_bytes"))
    page.fact("keys", d.get("keys"))
    beyond = d.get("bytes_per_pending_beyond_payload")
    for key, met_key, label in (("goal_beyond_payload", "goal_met", "goal"),
                                ("floor_beyond_payload", "floor_met", "floor")):  # fmt: skip
        goal = parse_goal(d.get(key))
        if goal:
            page.row(f"Redis bytes per pending record beyond its payload ({label})", beyond,
                     goal=goal, recorded_met=d.get(met_key))  # fmt: skip
    page.row("Redis bytes per pending record, payload included", d.get("bytes_per_pending"))
    page.row("records persisted per second", d.get("persist_records_per_s"))
    parts = d.get("breakdown_bytes_per_pending") or {}
    page.table("Where the bytes go (per pending record):", ["structure", "bytes"],
               [[k, num(v)] for k, v in sorted(parts.items())])


def render_layout(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("ack entry bytes", d.get("entry_bytes"))
    page.fact("frame header bytes", d.get("frame_header_bytes"))
    cands = d.get("candidates") or {}
    now = next((k for k in sorted(cands) if "(now)" in k), None)
    before = next((k for k in sorted(cands) if "(before)" in k), None)
    key = "bytes_per_pending_beyond_payload"
    if now:
        page.row(f"bytes per pending record beyond the payload: {now}", cands[now].get(key),
                 cands[before].get(key) if before else None, before or "",
                 ratio(cands[now].get(key), cands[before].get(key)) if before else None)
    cols = ["bytes_per_pending_beyond_payload", "memory_usage_beyond_payload", "keys",
            "encodings", "fill_s"]  # fmt: skip
    page.table("Every candidate (`used_memory` and `MEMORY USAGE`, beyond the payload):",
               ["candidate", *cols],
               [[k, *(num(c.get(col)) for col in cols)] for k, c in sorted(cands.items())])


def render_rotation(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("timeout s", d.get("timeout_s"))
    page.fact("buckets", d.get("buckets"))
    page.row("one idle rotation (N pending, none due)", d.get("idle_rotation_ms"), unit="ms")
    page.row("expiry of all N: records/s", d.get("expiry_records_per_s"))
    page.row("expiry of all N: total / longest rotation",
             f"{num(d.get('expiry_total_s'))} s / {num(d.get('expiry_longest_rotation_s'))} s "
             f"({num(d.get('expiry_rotations'))} rotations)")  # fmt: skip
    page.row("sidecar RSS, idle / peak",
             f"{num(d.get('sidecar_rss_mb_idle'))} / {num(d.get('sidecar_rss_mb_peak'))} MB")
    page.row("Redis bytes per pending record (payload included)",
             d.get("redis_bytes_per_pending"))
    page.row("records persisted per second", d.get("persist_records_per_s"))
