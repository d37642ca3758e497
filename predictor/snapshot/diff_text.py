"""The readable table of a snapshot diff (:func:`predictor.snapshot.diff.diff_snapshots`).

Bytes print as exact integers with PyTorch's own ``format_size`` beside them; every row
says which side and which metric (requested bytes of allocations; the peaks are the
allocator's allocated and reserved bytes).
"""

from __future__ import annotations

from typing import Any

from memgnn.predictor.sim.allocator import format_size

__all__ = ["diff_text"]


def _b(n: int) -> str:
    sign = "-" if n < 0 else ""
    return f"{n} ({sign}{format_size(abs(n))})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def _side(name: str, s: dict[str, Any]) -> str:
    step = f", step {s['step']}" if s.get("step") else ""
    return (
        f"{name}: {s['file']} (device {s['device']}{step}): {s['allocs']} allocs in "
        f"{s['events']} events, {s['blocks_before_recording']} blocks allocated before "
        f"recording ({_b(s['bytes_before_recording'])}); stack frames: "
        f"{'yes' if s['frames'] else 'no'}"
    )


def _phases_from(p: dict[str, Any]) -> str:
    if "labelled_allocations" not in p:
        return p["method"]
    starts = ", ".join(f"{k} from event {v}" for k, v in p["phase_starts"].items())
    return (
        f"{p['method']} ({p['agreeing']} of {p['labelled_allocations']} rank-matched labels "
        f"agree; {starts})"
    )


def _where(row: dict[str, Any]) -> str:
    """The most frequent source line behind a size, real side first."""
    for side, key in (("real", "real_lines"), ("predicted", "predicted_lines")):
        if row.get(key):
            line, count = row[key][0]
            return f"{side}: {line} (x{count})"
    return ""


def _sizes(title: str, rows: list[dict[str, Any]], total: int, count: int) -> list[str]:
    out = [f"{title}: {count} sizes, {_b(total)}"]
    if not rows:
        return out
    body = [
        [str(r["size"]), str(r["real"]), str(r["predicted"]), _b(r["bytes"]), _where(r)]
        for r in rows
    ]
    head = ["size", "real", "predicted", "bytes (real - predicted)", "where (frames)"]
    return out + ["  " + x for x in _table(head, body)]


def _composition(peak: dict[str, Any]) -> list[str]:
    r, p = peak["real"], peak["predicted"]
    out = []
    for key, title in (("by_size_class", "size class"), ("by_phase", "phase"),
                       ("by_category", "category")):  # fmt: skip
        if key not in r and key not in p:
            continue
        names = list(dict.fromkeys([*r.get(key, {}), *p.get(key, {})]))
        rows = [
            [n, _b(r.get(key, {}).get(n, 0)) if key in r else "-",
             _b(p.get(key, {}).get(n, 0)) if key in p else "-"]
            for n in names
        ]  # fmt: skip
        out += [f"  by {title}:"] + ["    " + x for x in _table([title, "real", "predicted"], rows)]
    return out


def diff_text(doc: dict[str, Any]) -> str:
    """The diff document as text (the ``--json`` document has everything)."""
    r, p = doc["real"], doc["predicted"]
    pr, pp = doc["peak"]["real"], doc["peak"]["predicted"]
    out = [
        _side("real", r),
        _side("predicted", p),
        f"phases: real {_phases_from(doc['phases_from']['real'])}; predicted "
        f"{_phases_from(doc['phases_from']['predicted'])}",
        "",
        f"peak allocated (allocator bytes): real {_b(pr['allocated_bytes'])} at event "
        f"{pr['event']}, predicted {_b(pp['allocated_bytes'])} at event {pp['event']}",
        f"peak reserved: real {_b(pr['peak_reserved_bytes'])}, predicted "
        f"{_b(pp['peak_reserved_bytes'])}",
    ]
    if doc["identical"]:
        return "\n".join([*out, "", "no difference: the same sizes in every phase, the same "
                          "peaks and the same peak composition"]) + "\n"  # fmt: skip
    rows = [
        [t["phase"], str(t["real"]["allocs"]), _b(t["real"]["bytes"]),
         str(t["predicted"]["allocs"]), _b(t["predicted"]["bytes"]), _b(t["only_real_bytes"]),
         _b(t["only_predicted_bytes"]), _b(t["count_differs_bytes"])]
        for t in doc["phases"]
    ]  # fmt: skip
    head = ["phase", "real allocs", "real bytes", "pred. allocs", "predicted bytes",
            "only real", "only predicted", "count differs"]  # fmt: skip
    s = doc["sizes"]
    out += ["", "requested bytes per phase (only: sizes the other side never requests; count "
            "differs: real - predicted):", *_table(head, rows), ""]  # fmt: skip
    out += ["requested sizes over the whole step:"]
    out += _sizes("only the real run", s["only_real"], s["only_real_bytes"], s["only_real_sizes"])
    out += _sizes("only the prediction", s["only_predicted"], -s["only_predicted_bytes"],
                  s["only_predicted_sizes"])  # fmt: skip
    out += _sizes("both, a different number of times (real - predicted)", s["count_differs"],
                  s["count_differs_bytes"], s["count_differs_sizes"])  # fmt: skip
    out += ["", "live requested bytes at each side's allocated peak:", *_composition(doc["peak"])]
    return "\n".join(out) + "\n"
