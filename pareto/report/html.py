"""`pareto report`: one study as a self-contained HTML page with PNG figures beside it.

The page reads the database only (``pareto.api``'s ``trials``, ``frontier``, ``best`` and ``studies``,
plus the host's calibration for the roofline ceilings: ``pareto.report.data``) and changes nothing in it.
Figures are drawn with matplotlib's Agg canvas (no display, no pyplot state: ``pareto.report.figures``);
the page needs no script, stylesheet or font from anywhere else.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pareto.errors import ParetoError, UsageError
from pareto.limits import Limits
from pareto.machine import describe_cpu_features
from pareto.metrics import METHOD_SEPARATOR
from pareto.naming import describe_config
from pareto.report.data import ReportData, escape, load_data, trial_status
from pareto.report.figures import ReportFigure, draw_all
from pareto.report.tables import capacity_words
from pareto.report.traffic import traffic_drawers
from pareto.slo import within
from pareto.units import format_bytes, format_ms

#: What to install when matplotlib is missing.
INSTALL_HINT = "pip install 'pareto-slo[report]'"
#: The file the page is written to inside the output folder.
INDEX = "index.html"
#: The page shows each PNG at ``1 / _ZOOM`` its pixels.
_ZOOM = 1.6


def write_report(
    out_dir: str | os.PathLike[str],
    limits: Limits | None = None,
    /,
    *,
    force: bool = False,
    db: str | None = None,
    **keywords: Any,
) -> dict[str, Any]:
    """Write ``out_dir/index.html`` and its PNG figures for one study in one environment.

    Args:
        out_dir: The folder to write; created when missing. An existing folder must be empty unless ``force``.
        limits: The study (may be omitted when the database holds one), the environment (``latest``,
            the default, or a key; not ``all``) and the limits to judge by (default: the study's
            own); or their fields as keywords (``study``, ``slo_p99``…).
        force: Write into a folder that already holds files (same-named files are replaced).
        db: Database URL; defaults to ``PARETO_DB_URL`` or ``sqlite:///pareto.db``.

    Returns:
        ``{"index", "figures", "skipped", "study", "trials", "frontier", "pick", "note"}``: the page's
        path, the figures' paths, ``{figure: why}`` for each one left out, the trial counts, the
        pick's trial number (None when nothing meets the SLOs) and the environment note, if any.

    Raises:
        ParetoError: matplotlib is not installed.
        UsageError: the folder is not empty (without ``force``) or cannot be written; bad SLOs;
            ``environment="all"``.
        NotFound: no such study.
    """
    _require_matplotlib()
    target = Path(out_dir).expanduser().absolute()
    _check_target(target, force=force)
    data = load_data(Limits.of(limits, **keywords), db)
    _make_dir(target)
    figures = draw_all(data, target, traffic_drawers() if data.constraints.qps else None)
    page = _page(data, figures)
    index = target / INDEX
    try:
        index.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {index}: {exc.strerror or exc}.") from exc
    return {
        "index": str(index),
        "figures": [str(target / f.file) for f in figures if f.file],
        "skipped": {f.key: f.skipped for f in figures if f.skipped},
        "study": data.study,
        "trials": len(data.rows),
        "frontier": len(data.front),
        "pick": data.pick["trial"] if data.pick else None,
        "note": (data.environment or {}).get("note"),
    }


# --- input checks ----------------------------------------------------------------------------------


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ParetoError(
            f"The HTML report draws its figures with matplotlib, which is missing: {INSTALL_HINT}"
        ) from exc


def _check_target(target: Path, *, force: bool) -> None:
    """Refuse a non-empty folder (without ``force``) or a path that cannot become a folder, creating nothing."""
    try:
        _check_existing_target(target, force=force)
    except OSError as exc:  # a name too long for the file system, a folder it may not list
        raise UsageError(f"Cannot write the report to {str(target)[:200]}: {exc.strerror or exc}.") from exc


def _check_existing_target(target: Path, *, force: bool) -> None:
    if target.exists():
        if not target.is_dir():
            raise UsageError(f"Cannot write the report to {target}: it is a file, not a folder.")
        if not force and any(target.iterdir()):
            raise UsageError(f"Folder {target} is not empty; choose another -o or pass --force to write into it.")
        if not os.access(target, os.W_OK | os.X_OK):
            raise UsageError(f"Cannot write the report to {target}: the folder is not writable.")
        return
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"Cannot write the report to {target}: {parent} is a file, not a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"Cannot write the report to {target}: folder {parent} is not writable.")


def _make_dir(target: Path) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {target}: {exc.strerror or exc}.") from exc


# --- the page --------------------------------------------------------------------------------------


_CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d1d1f;
max-width:1180px;margin:0 auto;padding:24px;background:#fff}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin:0 0 16px}.grid{display:grid;grid-template-columns:1fr 1fr;gap:20px}
@media (max-width:900px){.grid{grid-template-columns:1fr}}
.card{border:1px solid #ddd;border-radius:6px;padding:12px 16px}.card h3{margin:0 0 8px;font-size:16px}
.pick{border-color:#1b9e77}.nopick{border-color:#d62728}
table{border-collapse:collapse;width:100%}th,td{text-align:left;vertical-align:top;padding:3px 8px}
.kv th{white-space:nowrap;color:#444;font-weight:600;width:1%}
.front th{background:#f3f3f3;border-bottom:1px solid #ccc;white-space:nowrap}.front td{border-bottom:1px solid #eee}
.front td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.front tr.picked td{background:#fdecec;font-weight:600}
.meets{color:#137a5c}.misses{color:#8a8a8a}.uncertain{color:#a87800}.warn{color:#a33}
figure{margin:12px 0 24px}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#444;font-size:14px;margin-top:6px}.skipped{color:#555;font-style:italic}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px}
.method li{margin-bottom:4px}footer{color:#777;font-size:13px;margin-top:32px}
"""

#: Counts the images that loaded once the page has: a check for tests and people, not needed to read it.
_IMAGES_LOADED_SCRIPT = (
    "<script>window.addEventListener('load',function(){var a=document.images,n=0;"
    "for(var i=0;i<a.length;i++){if(a[i].complete&&a[i].naturalWidth>0)n++;}"
    "document.body.setAttribute('data-images-loaded',n+'/'+a.length);});</script>"
)


def _page(data: ReportData, figures: list[ReportFigure]) -> str:
    env = data.environment or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>pareto report: study {escape(data.study)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Study {escape(data.study)}</h1>",
        f'<p class="sub">task {escape(data.task)} · {len(data.rows):,} completed trials in this environment · '
        f"{len(data.front):,} on the frontier · written {escape(_now())} UTC by pareto {escape(_version())}</p>",
    ]
    if env.get("note"):
        parts.append(f'<p class="warn">{escape(env["note"])}</p>')
    parts.append('<div class="grid">')
    parts.append(_study_card(data))
    parts.append(_pick_card(data))
    parts.append("</div>")
    parts.append(_method_section(data))
    for f in figures:
        parts.append(f'<section id="{escape(f.key)}"><h2>{escape(f.title)}</h2>')
        if f.file:
            w, h = round(f.width / _ZOOM), round(f.height / _ZOOM)
            parts.append(
                f'<figure><img src="{escape(f.file)}" alt="{escape(f.alt)}" width="{w}" height="{h}">'
                f"<figcaption>{f.caption}</figcaption></figure>"
            )
        else:
            parts.append(f'<p class="skipped">{escape(f.skipped)}</p>')
        parts.append("</section>")
    parts.append(_frontier_table(data))
    parts.append(
        "<footer>Read from the database without changing it. Every latency is measured with the method above; "
        "P99 bounds are one-sided confidence bounds that cover the spread between rounds. Regenerate with "
        f"<code>pareto report --study {escape(shlex.quote(data.study))} -o DIR --force</code>.</footer>"
    )
    parts.append(_IMAGES_LOADED_SCRIPT)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _kv(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already escaped by the caller."""
    body = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _study_card(data: ReportData) -> str:
    env = data.environment or {}
    device = env.get("device", "—")
    if env.get("device_name") and env.get("device_name") != env.get("cpu_model"):
        device = f"{device} ({env['device_name']})"
    rows = [
        ("study", escape(data.study)),
        ("task", escape(data.task)),
        ("objectives", escape(", ".join(data.objectives))),
        ("SLO", escape(data.constraints.describe())),
        ("device", escape(device)),
        ("CPU", escape(env.get("cpu_model", "—"))),
        ("CPU kernels", escape(describe_cpu_features(env["cpu_features"]) if env.get("cpu_features") else "—")),
        ("threads", escape(env.get("threads", "—"))),
        ("torch", escape(env.get("torch_version", "—"))),
    ]
    if env.get("driver"):
        rows.append(("driver", escape(env["driver"])))
    rows.append(("host", escape(env.get("hostname", "—"))))
    rows.append(("environment", f"<code>{escape(env.get('key', '—'))}</code>"))
    return f'<div class="card"><h3>Study and environment</h3>{_kv(rows)}</div>'


def _pick_card(data: ReportData) -> str:
    focus = data.focus
    if data.pick is None:
        head = f'<p class="warn">{escape(data.no_pick or "No configuration meets the SLOs.")}</p>'
        if focus is None:
            return f'<div class="card nopick"><h3>No pick</h3>{head}</div>'
        title, css = f"No pick; the closest is trial {focus['trial']}", "nopick"
    else:
        head, title, css = "", f"The pick: trial {focus['trial'] if focus else '?'}", "pick"
    assert focus is not None
    m, slo = focus["metrics"], focus.get("slo") or {}
    delta = m.get("accuracy_delta")
    accuracy = f"{m['accuracy']:.4f}" + ("" if delta is None else f" ({delta:+.4f} vs the baseline)")
    p99 = (
        f"{escape(format_ms(m['latency_p99_ms']))}; bounds {escape(format_ms(m.get('latency_p99_lower_ms')))} – "
        f"<b>{escape(format_ms(m.get('latency_p99_upper_ms')))}</b>, each {m['confidence']:.3g} one-sided, "
        f"{m.get('rounds') or 1} rounds"
    )
    verdict = slo.get("p99_verdict")
    rows = [
        ("configuration", escape(_describe(focus))),
        (data.score, escape(accuracy)),
        ("P99 and bound", p99),
        (
            "p50 / p90 / p99.9",
            escape(" / ".join(format_ms(m.get(k)) for k in ("latency_p50_ms", "latency_p90_ms", "latency_p999_ms"))),
        ),
        (
            "SLO",
            escape(f"{data.constraints.describe()}: {_judgement(slo, verdict)}"),
        ),
        (
            "speedup P99",
            escape(
                _times(m.get("speedup_p99")) + f" over the baseline, compression {_times(m.get('compression_ratio'))}"
            ),
        ),
        ("throughput", escape(f"{m['throughput_per_s']:,.0f} samples/s at batch {m['batch_size']}")),
        ("memory", escape(format_bytes(m.get("memory_bytes") or m.get("params_bytes")))),
        ("confirmed", escape(_confirmation(focus.get("confirmation")))),
        *_at_rate(focus),
    ]
    return f'<div class="card {css}"><h3>{escape(title)}</h3>{head}{_kv(rows)}</div>'


def _at_rate(focus: dict[str, Any]) -> list[tuple[str, str]]:
    """At a request rate: the requests' P99 there, the capacity (load-run or labelled simulated) and the
    load run; nothing for a study searched one call at a time."""
    m = focus["metrics"]
    if m.get("scenario") is None:
        return []
    at = (
        f"request P99 {format_ms(m.get('request_p99_ms'))} (≤ {format_ms(m.get('request_p99_upper_ms'))}), "
        f"simulated, max batch {m.get('max_batch')}, wait {format_ms(m.get('max_wait_ms'))}"
    )
    rows = [(f"at {m['qps']:,.4g} requests/s", escape(at)), ("capacity", escape(capacity_words(m)))]
    load, slo = focus.get("load_run"), (focus.get("slo") or {}).get("p99_ms")
    if load:
        upper = load.get("p99_upper_ms")
        verdict = "meets" if load["valid"] and within(upper, slo) else "misses"
        valid = f"{verdict} {format_ms(slo)}" if load["valid"] else f"not valid: {str(load.get('reason')).rstrip('.')}"
        runs = f" over {load['replications']} runs" if load.get("replications", 1) > 1 else ""
        said = (
            f"request P99 {format_ms(load['p99_ms'])} (≤ {format_ms(load.get('p99_upper_ms'))}) at "
            f"{load['qps']:,.4g}/s, {load['requests']} requests{runs}, {valid}"
        )
        rows.append(("load run", escape(said)))
    return rows


def _judgement(slo: dict[str, Any], verdict: str | None) -> str:
    p99 = f"P99 {verdict}" if verdict else "no P99 SLO"
    if slo.get("feasible") is False:
        return f"{p99}; does not meet every limit (above)"
    return f"{p99}; meets every limit" if slo.get("feasible") else p99


def _times(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _describe(row: dict[str, Any]) -> str:
    config = row.get("config") or {}
    return describe_config(config) if "batch_size" in config else str(config)


def _confirmation(confirmation: dict[str, Any] | None) -> str:
    if not confirmation:
        return "no: measured once, during the search; 'pareto confirm' re-measures it with the baseline"
    when = str(confirmation.get("confirmed_at", ""))[:16].replace("T", " ")
    return (
        f"yes: {confirmation.get('rounds')} rounds interleaved with the baseline at {when} UTC, "
        f"{confirmation.get('discarded_rounds') or 0} discarded for contention"
    )


def _method_section(data: ReportData) -> str:
    focus = data.focus or data.baseline or (data.rows[0] if data.rows else None)
    if focus is None:
        return '<h2>Measurement method</h2><p class="skipped">No trial was measured in this environment.</p>'
    m = focus["metrics"]
    terms = [t.strip() for t in str(m.get("method") or "").split(METHOD_SEPARATOR) if t.strip()]
    summary = (
        f"{m['samples']:,} timed calls kept in {m.get('rounds') or 1} rounds "
        f"({m.get('discarded_rounds') or 0} discarded for contention), {m.get('warmup', 0)} warm-up calls; "
        f"every latency bound is {m['confidence']:.3g} one-sided"
        + (f"; the P99 bound came from {m['p99_bound']}" if m.get("p99_bound") else "")
        + "."
    )
    items = "".join(f"<li>{escape(t)}</li>" for t in terms)
    return (
        f"<h2>Measurement method</h2><p>Of trial {focus['trial']} ({escape(_describe(focus))}): {escape(summary)} "
        "The other trials of the study were measured the same way (their own counts are in "
        f'<code>pareto frontier --json</code>).</p><ul class="method">{items}</ul>'
    )


def _frontier_table(data: ReportData) -> str:
    if not data.front:
        return '<h2>Frontier</h2><p class="skipped">No trial has every objective measured: the frontier is empty.</p>'
    head = (
        f"<tr><th>trial</th><th>configuration</th><th>{escape(data.score)}</th><th>p50</th><th>p99</th><th>p99 ≤</th>"
        "<th>throughput/s</th><th>memory</th><th>compression</th><th>speedup p99</th><th>SLO</th></tr>"
    )
    picked = data.pick["trial"] if data.pick else None
    body = []
    for r in data.front:
        m, status = r["metrics"], trial_status(r)
        mark = {"meets": "meets", "misses": "misses", "uncertain": "uncertain", "unjudged": "—"}[status]
        if r.get("confirmation"):
            mark += " ✓"
        cls = ' class="picked"' if r["trial"] == picked else ""
        cells = [
            f'<td class="n">{r["trial"]}</td>',
            f"<td>{escape(_describe(r))}</td>",
            f'<td class="n">{m["accuracy"]:.4f}</td>',
            f'<td class="n">{escape(format_ms(m.get("latency_p50_ms")))}</td>',
            f'<td class="n">{escape(format_ms(m.get("latency_p99_ms")))}</td>',
            f'<td class="n">{escape(format_ms(m.get("latency_p99_upper_ms")))}</td>',
            f'<td class="n">{m["throughput_per_s"]:,.0f}</td>',
            f'<td class="n">{escape(format_bytes(m.get("memory_bytes") or m.get("params_bytes")))}</td>',
            f'<td class="n">{escape(_times(m.get("compression_ratio")))}</td>',
            f'<td class="n">{escape(_times(m.get("speedup_p99")))}</td>',
            f'<td class="{status}">{escape(mark)}</td>',
        ]
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    objectives = ", ".join(data.objectives)
    return (
        f"<h2>Frontier ({len(data.front):,} configurations; objectives {escape(objectives)})</h2>"
        f'<table class="front">{head}{"".join(body)}</table>'
        "<p>p99 ≤: the one-sided upper confidence bound the SLO verdict uses. ✓: confirmed in interleaved rounds "
        "with the baseline. Highlighted: the pick. Speedup: over the uncompressed model timed in the same run, at "
        "the same batch size.</p>"
    )


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pareto-slo")
    except PackageNotFoundError:
        return "(not installed)"
