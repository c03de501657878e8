"""The sidecar's status page (``/``) and its JSON (``/api/status``): the Storm UI's view of
one namespace -- what is pending where, how fast records complete, fail, replay and die,
how long completion takes, who rotates, and the newest dead letters with their payloads.

``/api/status`` answers one object::

    namespace, version, generated_at (ISO 8601), redis_up, error (when Redis is down),
    warnings: [text] (what an operator must fix though it works: an evicting Redis),
    sidecar: {id, leader, role, ready, alive}, lease_holder (the id holding the rotation lease),
    settings: {shards, timeout_s, buckets, max_replays},
    totals: {persisted, completed, failed_explicit, failed_timeout, replayed,
             replays_claimed, replays_vanished, dead_lettered, redriven, pending,
             queued_replays, dead_letters, unsettled_segments, oldest_pending_age_s},
    rates_per_s: {persisted, completed, failed, replayed, dead_lettered}
                 (over the last RATE_WINDOW_S of samples; null until two samples),
    sources: [{source, pending, queued}],
    latency_ms: {count, mean, p50, p90, p99} (persist or claim -> completion; a batch
                scope row: its batch's start -> the batch's settlement),
    stages: [{pipeline, stage, batches, rows_in, rows_out, failed, replayed,
              dead_lettered, unconfirmed, held, p50_ms, p99_ms}] (the pipelines' batches of the
              last HISTORY_S: ftlayer.history),
    charts: {now, t, completed_per_s, failed_per_s, pending, p99_ms} (parallel lists
             but ``now``, times in unix seconds: the leader sidecar's samples of the last
             HISTORY_S),
    dead_letters_newest: [{id, source, time, reason, attempts, error, preview}]
    payload_previews (false: each preview is null)

Rates come from samples of the cumulative counters, one per request (the page polls every
two seconds), kept for RATE_WINDOW_S. Percentiles are estimated from the completion
histogram by linear interpolation within a bucket (Prometheus's ``histogram_quantile``).
The HTML is rendered on the server (it works without JS) and updated in place by a small
script polling ``/api/status``; every value is escaped (payloads are user data) and the
script writes text only (``textContent``), never markup.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import redis

from ftlayer import __version__
from ftlayer.deadletters import iso_time, newest_dead_letters, preview
from ftlayer.history import histogram_quantile, read_batches, read_samples, series, stage_table
from ftlayer.layer import LATENCY_BOUNDS_MS, FTStats
from ftlayer.unreplayed import warnings_of

if TYPE_CHECKING:
    from ftlayer.service.sidecar import Sidecar

__all__ = ["RATE_WINDOW_S", "StatusModel", "latency_percentile", "render_page"]

RATE_WINDOW_S = 30.0
HISTORY_S = 3600.0
"""The stage table and the charts cover this much of the past (ftlayer.history)."""
NEWEST_DEAD_LETTERS = 10
_RATED = ("persisted", "completed", "failed", "replayed", "dead_lettered")


def latency_percentile(st: FTStats, q: float) -> float | None:
    """The q-quantile (0..1) of completion latency in ms, interpolated within its bucket;
    None without completions. Past the last bound it answers the last bound."""
    cumulative = [st.latency_buckets.get(str(b), 0) for b in LATENCY_BOUNDS_MS]
    return histogram_quantile(cumulative, st.latency_count, LATENCY_BOUNDS_MS, q)


def _counters(st: FTStats) -> dict[str, int]:
    return {"persisted": st.persisted, "completed": st.completed,
            "failed": st.failed_explicit + st.failed_timeout, "replayed": st.replayed,
            "dead_lettered": st.dead_lettered}  # fmt: skip


class StatusModel:
    """The data of the page, from Redis and the sidecar (thread-safe)."""

    def __init__(self, sidecar: Sidecar, previews: bool = True) -> None:
        self.sidecar = sidecar
        self.previews = previews
        """Whether dead letters' payloads are previewed (None in their place when not)."""
        self.layer = sidecar.layer
        self._samples: deque[tuple[float, dict[str, int]]] = deque()
        self._lock = threading.Lock()

    def _rates(self, st: FTStats) -> dict[str, float] | None:
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, _counters(st)))
            while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW_S:
                self._samples.popleft()
            (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        if t1 - t0 < 0.5:
            return None
        return {k: round((last[k] - first[k]) / (t1 - t0), 2) for k in _RATED}

    def snapshot(self) -> dict[str, Any]:
        cfg, sc = self.layer.config, self.sidecar
        out: dict[str, Any] = {
            "namespace": cfg.namespace,
            "version": __version__,
            "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sidecar": {"id": sc.id, "leader": sc.leader, "ready": sc.ready()[0],
                        "alive": sc.alive()[0], "role": "leader" if sc.leader else "standby"},
            "settings": {"shards": cfg.shards, "timeout_s": cfg.timeout_s,
                         "buckets": cfg.buckets, "max_replays": cfg.max_replays},
            "payload_previews": self.previews,
        }  # fmt: skip
        try:
            st = self.layer.stats()
            holder = self.layer.client.get(self.layer.keyspace.lease)
            letters = newest_dead_letters(self.layer, NEWEST_DEAD_LETTERS)
            since = time.time() - HISTORY_S
            stages = stage_table(read_batches(self.layer.client, self.layer.keyspace, since))
            charts = series(read_samples(self.layer.client, self.layer.keyspace, since),
                            LATENCY_BOUNDS_MS)  # fmt: skip
            charts["now"] = since + HISTORY_S
        except redis.RedisError as e:
            return {**out, "redis_up": False, "error": str(e)}
        p = {f"p{int(q * 100)}": latency_percentile(st, q) for q in (0.5, 0.9, 0.99)}
        return {
            **out,
            "redis_up": True,
            "warnings": [*sc.warnings(), *warnings_of(self.layer, st.queued_by_source)],
            "lease_holder": cast(bytes, holder).decode() if holder else None,
            "totals": {k: getattr(st, k) for k in (
                "persisted", "completed", "failed_explicit", "failed_timeout", "replayed",
                "replays_claimed", "replays_vanished", "dead_lettered", "redriven", "pending",
                "queued_replays", "dead_letters", "unsettled_segments",
                "oldest_pending_age_s")},
            "rates_per_s": self._rates(st),
            "sources": [{"source": s, "pending": n, "queued": st.queued_by_source.get(s, 0)}
                        for s, n in sorted(st.pending_by_source.items())],
            "latency_ms": {"count": st.latency_count, "mean": st.mean_latency_ms,
                           **{k: None if v is None else round(v, 1) for k, v in p.items()}},
            "stages": stages,
            "charts": charts,
            "dead_letters_newest": [
                {"id": f"{d.source_id:016x}", "source": d.frame.source if d.frame else None,
                 "time": iso_time(d.time_ms), "attempts": d.attempts,
                 "reason": d.history[-1].reason if d.history else None,
                 "error": d.history[-1].error if d.history else None,
                 "preview": preview(d, 120) if self.previews else None}
                for d in letters
            ],
        }  # fmt: skip


# -- HTML ------------------------------------------------------------------------------------
_TILES = (  # (label, JSON path)
    ("pending", "totals.pending"), ("queued replays", "totals.queued_replays"),
    ("oldest pending, s", "totals.oldest_pending_age_s"),
    ("completed/s", "rates_per_s.completed"), ("failed/s", "rates_per_s.failed"),
    ("replayed/s", "rates_per_s.replayed"), ("dead-lettered/s", "rates_per_s.dead_lettered"),
    ("completed", "totals.completed"), ("failed (explicit)", "totals.failed_explicit"),
    ("failed (timeout)", "totals.failed_timeout"), ("replayed", "totals.replayed"),
    ("dead letters held", "totals.dead_letters"),
    ("replays vanished (lost)", "totals.replays_vanished"),
    ("latency p50, ms", "latency_ms.p50"), ("latency p90, ms", "latency_ms.p90"),
    ("latency p99, ms", "latency_ms.p99"), ("lease holder", "lease_holder"),
)  # fmt: skip

_CSS = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0}.sub{color:#666;margin:.2em 0 1em}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(11em,1fr));gap:.6em}
.tile{border:1px solid #ddd;border-radius:6px;padding:.5em .7em}
.tile b{display:block;font-size:1.4em;font-variant-numeric:tabular-nums;overflow-wrap:anywhere}
.tile span{color:#666;font-size:.85em}table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border-bottom:1px solid #eee;padding:.25em .6em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}code{font-size:.9em}
.down{color:#b00020;font-weight:bold}h2{font-size:1.05em;margin-top:1.4em}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(20em,1fr));gap:.6em}
.charts svg{border:1px solid #ddd;border-radius:6px;width:100%;height:auto}
.charts polyline{fill:none;stroke:#1f6feb;stroke-width:1.5}
.charts text{font:11px system-ui,sans-serif;fill:#666}.charts .ttl{fill:#222}"""

_JS = """const get=(o,p)=>p.split('.').reduce((v,k)=>v==null?v:v[k],o);
const fmt=v=>v==null?'–':typeof v==='boolean'?(v?'yes':'no'):typeof v==='number'?
(Number.isInteger(v)?v.toLocaleString('en'):v.toLocaleString('en',{maximumFractionDigits:2})):
String(v);
function rows(id,items,cols){const t=document.getElementById(id);t.replaceChildren();
for(const it of items){const tr=document.createElement('tr');for(const [k,num] of cols){
const td=document.createElement('td');if(num)td.className='n';td.textContent=fmt(it[k]);
tr.appendChild(td)}t.appendChild(tr)}}
async function poll(){try{const s=await (await fetch('api/status',{cache:'no-store'})).json();
for(const el of document.querySelectorAll('[data-k]'))el.textContent=fmt(get(s,el.dataset.k));
document.getElementById('down').textContent=s.redis_up?'':'Redis unreachable: '+s.error;
document.getElementById('warn').textContent=(s.warnings||[]).map(w=>'warning: '+w).join(' · ');
if(s.redis_up){for(const [id,[key,cols]] of Object.entries(TABLES))rows(id,s[key]||[],cols);
for(const svg of document.querySelectorAll('svg[data-series]')){const c=s.charts,
v=c[svg.dataset.series],xy=pts(c.now,c.t,v);svg.querySelector('polyline').setAttribute(
'points',xy[0]);svg.querySelector('.max').textContent=xy[1]}}}catch(e){document.getElementById('down').textContent=
'sidecar unreachable: '+e}}
function pts(now,t,v){const k=v.filter(x=>x!=null),top=Math.max(...k,0)||1;
const p=[];t.forEach((x,i)=>{if(v[i]!=null)p.push(((x-now+3600)/3600*300).toFixed(1)+','+
(80-v[i]/top*64).toFixed(1))});return [p.join(' '),'max '+fmt(Math.max(...k,0))]}
setInterval(poll,2000);"""


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.2f}".rstrip("0").rstrip(".")
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def _get(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _rows(items: list[dict[str, Any]], cols: tuple[tuple[str, bool], ...]) -> str:
    e = html.escape
    return "".join(
        "<tr>" + "".join(f'<td{" class=n" if num else ""}>{e(_fmt(it.get(k)))}</td>'
                         for k, num in cols) + "</tr>"
        for it in items
    )  # fmt: skip


_CHARTS = (  # (series, title)
    ("completed_per_s", "completed / s"), ("failed_per_s", "failed / s"),
    ("pending", "pending"), ("p99_ms", "p99 completion latency, ms"),
)  # fmt: skip
_TABLES: dict[str, tuple[str, tuple[tuple[str, str, bool], ...]]] = {
    # tbody id -> (its list in /api/status, its columns: (field, heading, numeric)); the
    # page's script fills the same tables from the same columns
    "stages": ("stages", (
        ("pipeline", "pipeline", False), ("stage", "stage", False),
        ("batches", "batches", True), ("rows_in", "rows in", True),
        ("rows_out", "rows out", True), ("failed", "failed", True),
        ("replayed", "replayed", True), ("dead_lettered", "dead-lettered", True),
        ("unconfirmed", "unconfirmed", True), ("held", "held (breaker)", True),
        ("p50_ms", "p50, ms", True),
        ("p99_ms", "p99, ms", True))),
    "sources": ("sources", (
        ("source", "source", True), ("pending", "pending", True),
        ("queued", "queued replays", True))),
    "dlq": ("dead_letters_newest", (
        ("id", "id", False), ("source", "source", True), ("time", "dead-lettered", False),
        ("attempts", "attempts", True), ("reason", "reason", False),
        ("error", "last error", False), ("preview", "payload", False))),
}  # fmt: skip


def _table(data: dict[str, Any], tbody: str) -> str:
    """One of the page's tables, its heading and rows, from _TABLES."""
    key, cols = _TABLES[tbody]
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title, _ in cols)
    rows = _rows(data.get(key, []), tuple((k, num) for k, _, num in cols))
    return f"<table><thead><tr>{head}</tr></thead><tbody id={tbody}>{rows}</tbody></table>"


def chart_points(now: float, t: list[float], values: list[Any]) -> tuple[str, str]:
    """An SVG polyline's points for one series over the last hour (x 0..300 from an
    hour ago to ``now``, y 80 at 0 up to 16 at the series' top; None: no point) and the
    label of its top (the page's script computes the same)."""
    known = [v for v in values if v is not None]
    top = max(known, default=0) or 1
    points = [f"{(x - now + HISTORY_S) / HISTORY_S * 300:.1f},{80 - v / top * 64:.1f}"
              for x, v in zip(t, values, strict=True) if v is not None]  # fmt: skip
    return " ".join(points), f"max {_fmt(max(known, default=0))}"


def _charts(data: dict[str, Any]) -> str:
    """Inline SVG line charts of the last hour: readable without the script, which only
    moves their points."""
    e, c = html.escape, data.get("charts") or {}
    out = []
    for key, title in _CHARTS:
        points, top = chart_points(c.get("now", 0.0), c.get("t", []), c.get(key, []))
        out.append(
            f'<svg viewBox="0 0 300 96" role=img aria-label="{e(title)}, last hour" '
            f'data-series="{e(key)}"><text class=ttl x=4 y=12>{e(title)}</text>'
            f'<text class=max x=296 y=12 text-anchor=end>{e(top)}</text>'
            f'<line x1=0 y1=80 x2=300 y2=80 stroke="#ddd"/>'
            f'<polyline points="{e(points)}"/>'
            f'<text x=4 y=93>−60 min</text><text x=296 y=93 text-anchor=end>now</text></svg>')
    return "".join(out)


def render_page(data: dict[str, Any]) -> str:
    """The whole page, server-rendered from one snapshot (see the module docstring)."""
    e = html.escape
    tiles = "".join(
        f'<div class=tile><b data-k="{e(path)}">{e(_fmt(_get(data, path)))}</b>'
        f"<span>{e(label)}</span></div>"
        for label, path in _TILES
    )
    st = data.get("settings", {})
    sc = data.get("sidecar", {})
    down = "" if data.get("redis_up") else f"Redis unreachable: {data.get('error', '')}"
    warn = " · ".join(f"warning: {w}" for w in data.get("warnings", []))
    tables = {key: [[k, num] for k, _, num in cols] for key, (_, cols) in _TABLES.items()}
    previews = "" if data.get("payload_previews", True) else (
        " Payload previews are off (<code>--payload-preview</code> turns them on).")
    script = f"const TABLES={json.dumps({t: [_TABLES[t][0], c] for t, c in tables.items()})};"
    return f"""<!doctype html><html lang=en><head><meta charset=utf-8>
<title>ftlayer · {e(data["namespace"])}</title>
<meta name=viewport content="width=device-width,initial-scale=1"><link rel=icon href="data:,">
<style>{_CSS}</style></head>
<body><h1>ftlayer · namespace <code>{e(data["namespace"])}</code></h1>
<p class=sub>version {e(data["version"])} · shards {e(_fmt(st.get("shards")))} · timeout
{e(_fmt(st.get("timeout_s")))} s · buckets {e(_fmt(st.get("buckets")))} · max replays
{e(_fmt(st.get("max_replays")))} · this sidecar <code>{e(str(sc.get("id")))}</code>
(<span data-k="sidecar.role">{e(str(sc.get("role")))}</span>) · updated
<span data-k="generated_at">{e(data["generated_at"])}</span></p>
<p id=down class=down>{e(down)}</p>
<p id=warn class=down>{e(warn)}</p>
<div class=tiles>{tiles}</div>
<h2>Last hour</h2><div class=charts>{_charts(data)}</div>
<h2>Stages, last hour</h2><p class=sub>per pipeline stage over its batches: each failed row is
replayed (at once in its task, or queued) or dead-lettered; unconfirmed ones time out and
replay; held: rows the stage did not get because its breaker was open (most of its rows
had failed: what it calls is down), queued for its next probe with no attempt charged; stage
<code>source</code> counts rows failed before any stage ran; time is the
stage's function per batch, summed over its tasks (DataFrame stages run in Spark's plan:
0)</p>
{_table(data, "stages")}
<h2>Pending by source</h2>{_table(data, "sources")}
<h2>Newest dead letters</h2><p class=sub><code>ftlayer dlq show ID</code> shows one whole;
<code>ftlayer dlq replay ID</code> re-drives it.{previews}</p>{_table(data, "dlq")}
<p class=sub><a href=metrics>/metrics</a> · <a href=api/status>/api/status</a> ·
<a href=readyz>/readyz</a> · <a href=healthz>/healthz</a></p>
<script>{script}{_JS}</script></body></html>"""


def status_json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, default=str).encode()
