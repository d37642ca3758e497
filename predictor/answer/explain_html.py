"""`render_html(doc) -> str`: the `explain` document (`ExplainAnswer.to_dict()`, what
`memgnn explain --json` prints and `POST /explain` returns) as one self-contained HTML
page: inline CSS, an inline SVG timeline and a few lines of inline JS (a hover read-out),
nothing fetched. Every text from the document is escaped (`html.escape`): module names
and file paths come from the user's code.

Sections: the peak (allocated = tensors + rounding, reserved, where), the memory timeline
of the replayed step (`doc["timeline"]`: allocated and reserved over the trace's events,
phases shaded, the peak marked; absent on the CPU), the breakdown by category, the tables
by module / source line / op, the largest tensors with why each is alive, the what-ifs
ranked by bytes saved, and what the answer assumed.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

__all__ = ["render_html"]

_W, _H = 1120, 380  # the timeline's drawing box (px)
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 70, 16, 30, 40
_PHASE_FILL = {
    "setup": "#f1f1f1",
    "input": "#efe6f7",
    "forward": "#e3f0ff",
    "backward": "#ffeede",
    "optimizer": "#e4f5e4",
    "zero_grad": "#fff6c8",
}
_CAT_COLOUR = {
    "parameter": "#4c72b0",
    "gradient": "#dd8452",
    "optimizer_state": "#55a868",
    "activation": "#c44e52",
    "temporary": "#937860",
    "input": "#8172b3",
    "cublas_workspace": "#8c8c8c",
    "scratch": "#da8bc3",
}
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1160px;color:#222;padding:0 16px}
h1{font-size:21px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:3px}.sub{color:#555;margin:0 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;background:#fafafa;min-width:150px}
.card b{display:block;font-size:19px}.card span{color:#666;font-size:12px}
table{border-collapse:collapse;width:100%;margin:4px 0 8px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eee;vertical-align:top}
th{background:#f4f4f4;font-weight:600}th.n{text-align:right}td.n{text-align:right;white-space:nowrap;
font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;
overflow-wrap:anywhere}.nw{white-space:nowrap}.why{color:#555;font-size:12.5px}
.bar{height:11px;background:#4c72b0;border-radius:2px;display:inline-block;vertical-align:middle}
.barcell{width:240px;white-space:nowrap}.neg{color:#b22}.pos{color:#161}
svg text{font:11px system-ui,sans-serif}#tip{font:12px ui-monospace,monospace;color:#333;
min-height:1.5em}ul.assume{color:#555;font-size:13px}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px}
"""
_JS = """
(function(){var d=JSON.parse(document.getElementById('tl-data').textContent);
var svg=document.getElementById('timeline'),tip=document.getElementById('tip'),
cur=document.getElementById('cursor');if(!svg)return;
function fmt(b){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(Math.abs(b)>=1024&&i<4){b/=1024;i++}
return i?b.toFixed(2)+' '+u[i]:b+' B'}
svg.addEventListener('mousemove',function(e){var r=svg.getBoundingClientRect();
var x=(e.clientX-r.left)*d.w/r.width;if(x<d.l||x>d.w-d.r)return;
var ev=(x-d.l)/(d.w-d.l-d.r)*Math.max(d.n-1,1),lo=0,hi=d.x.length-1;
while(lo<hi){var m=(lo+hi)>>1;if(d.x[m]<ev)lo=m+1;else hi=m}
var ph='';for(var k=0;k<d.p.length;k++){if(d.x[lo]>=d.p[k][0]&&d.x[lo]<d.p[k][1])ph=d.p[k][2]}
cur.setAttribute('x1',x);cur.setAttribute('x2',x);cur.style.display='';
tip.textContent='event '+d.x[lo]+' ('+ph+'): allocated '+fmt(d.a[lo])+', reserved '+fmt(d.rs[lo])});
svg.addEventListener('mouseleave',function(){cur.style.display='none';tip.textContent=' '})})();
"""


def _bytes(n: int | None) -> str:
    """1536 -> '1.50 KiB' (as `memgnn explain` prints); None -> '-'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _card(value: str, label: str) -> str:
    return f'<div class="card"><b>{_e(value)}</b><span>{_e(label)}</span></div>'


def _nice_step(top: float) -> float:
    raw = top / 5
    mag = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _timeline_svg(tl: dict[str, Any], peak: dict[str, Any]) -> str:
    """The SVG of the timeline: phases shaded, allocated and reserved lines, the peak."""
    n = max(int(tl["events"]), 1)
    xs, alloc, res = tl["event"], tl["allocated"], tl["reserved"]
    top_bytes = max([*res, *alloc, 1])
    cap = tl.get("capacity_bytes")
    show_cap = cap is not None and cap <= 1.6 * top_bytes
    if show_cap:
        top_bytes = max(top_bytes, cap)
    gib = top_bytes >= 2 << 30
    scale, unit = (float(1 << 30), "GiB") if gib else (float(1 << 20), "MiB")
    step = _nice_step(top_bytes * 1.08 / scale)
    y_top = step * (int(top_bytes * 1.08 / scale / step) + 1)
    pw, ph = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def px(i: float) -> float:
        return _PAD_L + pw * i / max(n - 1, 1)

    def py(b: float) -> float:
        return _PAD_T + ph * (1 - b / scale / y_top)

    out = [f'<svg id="timeline" viewBox="0 0 {_W} {_H}" width="100%" role="img" '
           f'aria-label="memory timeline">']  # fmt: skip
    last_step = None
    for span in tl["phases"]:
        x0, x1 = px(span["start"]), px(max(span["end"] - 1, span["start"]))
        fill = _PHASE_FILL.get(span["phase"], "#f2f2f2")
        out.append(f'<rect x="{x0:.1f}" y="{_PAD_T}" width="{max(x1 - x0, 0.5):.1f}" '
                   f'height="{ph}" fill="{fill}"><title>{_e(span["step"])} step, '
                   f'{_e(span["phase"])}: events {span["start"]}-{span["end"] - 1}'
                   "</title></rect>")  # fmt: skip
        if x1 - x0 > 46:
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{_PAD_T + 13}" text-anchor="middle" '
                       f'fill="#555">{_e(span["phase"])}</text>')  # fmt: skip
        if span["step"] != last_step:
            if last_step is not None:
                out.append(f'<line x1="{x0:.1f}" x2="{x0:.1f}" y1="{_PAD_T}" y2="{_PAD_T + ph}" '
                           'stroke="#999" stroke-dasharray="2,3"/>')  # fmt: skip
            out.append(f'<text x="{x0 + 3:.1f}" y="{_PAD_T - 6}" fill="#333">'
                       f'{_e(span["step"])} step</text>')  # fmt: skip
            last_step = span["step"]
    k = 0
    while k * step <= y_top + 1e-9:
        y = py(k * step * scale)
        label = f"{k * step:g} {unit}"
        out.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#ddd"/><text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" '
                   f'fill="#555">{label}</text>')  # fmt: skip
        k += 1
    for frac in (0, 0.25, 0.5, 0.75, 1):
        ev = round(frac * (n - 1))
        out.append(f'<text x="{px(ev):.1f}" y="{_H - _PAD_B + 15}" text-anchor="middle" '
                   f'fill="#555">{ev}</text>')  # fmt: skip
    out.append(f'<text x="{_PAD_L + pw / 2}" y="{_H - 6}" text-anchor="middle" fill="#333">'
               "trace event (each allocation or free of the replayed step)</text>")  # fmt: skip
    if show_cap:
        y = py(cap)
        out.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#d62728" stroke-dasharray="5,4"/><text x="{_W - _PAD_R - 4}" '
                   f'y="{y - 4:.1f}" text-anchor="end" fill="#d62728">device capacity '
                   f"{_e(_bytes(cap))}</text>")  # fmt: skip
    for series, colour, width in ((res, "#1f77b4", 1.8), (alloc, "#222", 1.2)):
        pts = " ".join(f"{px(x):.1f},{py(b):.1f}" for x, b in zip(xs, series))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                   f'stroke-width="{width}" stroke-linejoin="round"/>')  # fmt: skip
    at = int(tl["peak_event"])
    if at >= 0:
        metric_bytes = peak["reserved_bytes"] if peak["metric"] != "allocated" else None
        value = metric_bytes if metric_bytes is not None else peak["allocated_bytes"]
        x, y = px(at), py(value)
        anchor = "end" if x > _PAD_L + pw * 0.7 else "start"
        dx = -8 if anchor == "end" else 8
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{_PAD_T}" y2="{_PAD_T + ph}" '
                   'stroke="#c00" stroke-dasharray="4,3"/>'
                   f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="#c00"/>'
                   f'<text x="{x + dx:.1f}" y="{max(y - 8, _PAD_T + 26):.1f}" '
                   f'text-anchor="{anchor}" fill="#c00" font-weight="bold">peak '
                   f'{_e(peak["metric"])} {_e(_bytes(value))} ({_e(peak["phase"])}, event {at})'
                   "</text>")  # fmt: skip
    out.append(f'<line id="cursor" x1="0" x2="0" y1="{_PAD_T}" y2="{_PAD_T + ph}" '
               'stroke="#666" style="display:none"/>')  # fmt: skip
    out.append(f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#aaa"/></svg>')  # fmt: skip
    data = {"x": xs, "a": alloc, "rs": res, "n": n, "w": _W, "l": _PAD_L, "r": _PAD_R,
            "p": [[s["start"], s["end"], f"{s['step']} {s['phase']}"]
                  for s in tl["phases"]]}  # fmt: skip
    # JSON inside <script>: "</" cannot close the element once escaped.
    blob = json.dumps(data).replace("</", "<\\/")
    present = {s["phase"] for s in tl["phases"]}
    legend = (
        '<div><span class="swatch" style="background:#1f77b4"></span>reserved '
        '<span class="swatch" style="background:#222;margin-left:14px"></span>allocated '
        + "".join(
            f'<span class="swatch" style="background:{c};margin-left:14px;'
            f'border:1px solid #ccc"></span>{p}'
            for p, c in _PHASE_FILL.items()
            if p in present
        )
        + '</div><div id="tip"> </div>'
    )
    return (
        "\n".join(out)
        + legend
        + f'<script type="application/json" id="tl-data">{blob}</script><script>{_JS}</script>'
    )


def _share_bar(value: int, total: int, colour: str = "#4c72b0") -> str:
    frac = max(0.0, min(1.0, value / total)) if total else 0.0
    return (f'<td class="barcell"><span class="bar" style="width:{180 * frac:.0f}px;'
            f'background:{colour}"></span> {100 * frac:.1f}%</td>')  # fmt: skip


def _group_table(rows: list[dict[str, Any]], total: int, head: str, colours: bool = False) -> str:
    if not rows:
        return "<p>(none)</p>"
    out = [f'<table><tr><th>{_e(head)}</th><th class="n">bytes</th><th>share of the tensors'
           '</th><th class="n">blocks</th></tr>']  # fmt: skip
    for r in rows:
        colour = _CAT_COLOUR.get(r["name"], "#999") if colours else "#4c72b0"
        swatch = f'<span class="swatch" style="background:{colour}"></span>' if colours else ""
        out.append(f'<tr><td class="mono">{swatch}{_e(r["name"])}</td>'
                   f'<td class="n">{_e(_bytes(r["bytes"]))}</td>'
                   f'{_share_bar(r["bytes"], total, colour)}'
                   f'<td class="n">{r["blocks"]}</td></tr>')  # fmt: skip
    return "".join(out) + "</table>"


def _shape(b: dict[str, Any]) -> str:
    if b.get("shape") is None:
        return "?"
    return "x".join(map(str, b["shape"])) if b["shape"] else "scalar"


def _largest(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    out = ["<table><tr><th>bytes</th><th>shape</th><th>dtype</th><th>category</th>"
           "<th>module / source line, and why it is alive</th></tr>"]  # fmt: skip
    for b in rows:
        where = " ".join(x for x in (b.get("module") or "",
                                     b.get("source") and f"({b['source']})") if x)  # fmt: skip
        out.append(f'<tr><td class="n">{_e(_bytes(b["bytes"]))}</td>'
                   f'<td class="mono nw">{_e(_shape(b))}</td><td>{_e(b.get("dtype") or "")}</td>'
                   f'<td>{_e(b.get("category") or "")}</td><td><div class="mono">{_e(where)}'
                   f'</div><div class="why">{_e(b.get("why") or "")}</div></td></tr>')  # fmt: skip
    return "".join(out) + "</table>"


def _whatifs(doc: dict[str, Any]) -> str:
    rows, base = doc.get("whatifs") or [], doc["prediction"]["predicted_peak_bytes"]
    out = []
    if rows:
        out.append('<table><tr><th class="n">#</th><th>what-if, and how</th>'
                   '<th class="n">peak</th><th class="n">saves</th><th>peak vs now</th>'
                   '<th class="n">step cost</th></tr>')  # fmt: skip
        for k, w in enumerate(rows, 1):
            cls = "pos" if w["saved_bytes"] > 0 else ("neg" if w["saved_bytes"] < 0 else "")
            cost = f"x{w['cost']:.3g}" if w.get("cost") is not None else "-"
            how = w.get("command") or _how(w)
            how_div = f"<div><code>{_e(how)}</code></div>" if how != w["label"] else ""
            frac = w["predicted_peak_bytes"] / base if base else 0.0
            colour = "#c44e52" if frac > 1 else "#55a868"
            bar = (f'<td class="barcell"><span class="bar" style="width:{180 * min(frac, 1):.0f}px;'
                   f'background:{colour}"></span> {100 * frac:.1f}%</td>')  # fmt: skip
            out.append(f'<tr><td class="n">{k}</td><td>{_e(w["label"])}'
                       f"{how_div}</td>"
                       f'<td class="n">{_e(_bytes(w["predicted_peak_bytes"]))}</td>'
                       f'<td class="n {cls}">{_e(_bytes(w["saved_bytes"]))} '
                       f'({100 * w["saved_fraction"]:.1f}%)</td>{bar}'
                       f'<td class="n">{_e(cost)}</td></tr>')  # fmt: skip
        out.append("</table>")
    for s in doc.get("not_applicable") or []:
        out.append(f"<p class='why'>not applicable: {_e(s['name'])}: {_e(s['why'])}</p>")
    return "".join(out) or "<p>(no what-ifs asked)</p>"


def _how(w: dict[str, Any]) -> str:
    """The change as options (the CLI's flags are `memgnn explain`'s text answer)."""
    if w.get("alloc_conf"):
        return f"PYTORCH_CUDA_ALLOC_CONF={w['alloc_conf']}"
    parts = [f"{k}={v}" for k, v in (w.get("options") or {}).items()]
    parts += [f"{k}={v}" for k, v in (w.get("sizes") or {}).items()]
    return " ".join(parts)


def render_html(doc: dict[str, Any]) -> str:
    """The page for one `explain` document (see the module docstring)."""
    pred, peak = doc["prediction"], doc["peak"]
    model = pred.get("model") or {}
    name = model.get("spec") or pred.get("graph_id") or "graph"
    sizes = ", ".join(f"{k}={v}" for k, v in (pred.get("sizes") or {}).items())
    title = f"{name} ({sizes}) on {pred['device']}"
    total = peak["requested_bytes"]
    where = peak["module"] or "-"
    about = []
    if model:
        about.append(str(model.get("module_class", "")))
        if model.get("parameters") is not None:
            about.append(f"{int(model['parameters']):,} parameters")
        if model.get("trainable_parameters") not in (None, model.get("parameters")):
            about.append(f"{int(model['trainable_parameters']):,} trainable")
    cards = [
        _card(_bytes(pred["predicted_peak_bytes"]), f"{pred['metric']} peak ({pred['method']})"),
        _card(_bytes(peak["allocated_bytes"]), "allocated then"),
        _card(_bytes(peak["requested_bytes"]), "of which tensors"),
        _card(_bytes(peak["rounding_bytes"]), "block rounding"),
    ]
    if peak.get("cached_free_bytes") is not None:
        cards.append(_card(_bytes(peak["cached_free_bytes"]), "cached free (reserved - allocated)"))
    cards.append(_card(f"{peak['phase']} / {peak['step']}", "phase / step of the peak"))
    tl = doc.get("timeline")
    no_tl = "<p>No allocator timeline: the device has no caching allocator (CPU).</p>"
    timeline = _timeline_svg(tl, peak) if tl else no_tl
    tables = [("by module across layers", doc["by_layer_module"], "module (layers folded)")]
    if doc["by_layer_module"] != doc["by_module"]:
        tables.append(("by module", doc["by_module"], "module"))
    tables += [("by source line", doc["by_source"], "file:line"),
               ("by aten op", doc["by_op"], "op")]  # fmt: skip
    body = [
        f"<h1>What holds the peak: {_e(title)}</h1>",
        f'<p class="sub">{_e(" · ".join(x for x in about if x))}</p>' if about else "",
        '<div class="cards">' + "".join(cards) + "</div>",
        f"<p>The peak is at <code>{_e(peak['op'])}</code> in <code>{_e(where)}</code>"
        + (f" (<code>{_e(peak['source'])}</code>)" if peak.get("source") else "")
        + f", {_e(peak['phase'])} of the {_e(peak['step'])} step; "
        + f"{peak['blocks']} blocks live.</p>",
        "<h2>Memory over the step</h2>",
        timeline,
        "<h2>By category</h2>",
        _group_table(doc["by_category"], total, "category", colours=True),
    ]
    for head, rows, col in tables:
        body += [f"<h2>{_e(head.capitalize())}</h2>", _group_table(rows, total, col)]
    body += [
        "<h2>Largest tensors at the peak</h2>",
        _largest(doc["largest"]),
        "<h2>What-ifs, by bytes saved (each replayed)</h2>",
        _whatifs(doc),
        "<h2>Assumptions</h2>",
        '<ul class="assume">' + "".join(f"<li>{_e(a)}</li>" for a in doc["assumptions"]) + "</ul>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>memgnn explain: {_e(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
