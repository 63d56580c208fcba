"""The peer benchmark's figures as Markdown tables, one per scenario, arms side by side."""

from __future__ import annotations


def _failed(row: dict) -> str:
    if not row["failed"]:
        return "0"
    total = sum(row["failed"].values())
    return f"{total}: " + ", ".join(f"{n} {reason}" for reason, n in row["failed"].items())


def _pair(a, b) -> str:
    return f"{'-' if a is None else a} / {'-' if b is None else b}"


ROWS = (
    ("highest in flight, primary / fallback (width {width})",
     lambda r: _pair(r["max_in_flight"]["primary"], r["max_in_flight"]["fallback"])),
    ("requests failed (by reason)", _failed),
    ("answered within deadline", lambda r: f"{r['answered_within_deadline']} of {r['requests']}"),
    ("interactive p50 / p99 ms (sent to answer)", lambda r: _pair(r["interactive_p50_ms"], r["interactive_p99_ms"])),
    ("interactive p99 / plain Celery's", lambda r: r.get("interactive_p99_vs_plain_celery", "-")),
    ("backend calls per request", lambda r: r["backend_calls_per_request"]),
    ("calls served by primary / fallback", lambda r: _pair(r["served_by"]["primary"], r["served_by"]["fallback"])),
    ("routing layer CPU ms per request", lambda r: r["cpu_ms_per_request"]),
)


def markdown(out: dict) -> str:
    lines = []
    for scenario, rows in out["figures"].items():
        arms = list(rows)
        about = out["scenarios"][scenario]
        lines += ["", f"{scenario} ({about['requests']} requests per round, {out['rounds']} round(s))", "",
                  "| | " + " | ".join(arms) + " |", "| --- |" + " --- |" * len(arms)]
        for label, cell in ROWS:
            width = next(iter(rows.values()))["width"] if rows else "?"
            lines.append(f"| {label.format(width=width)} | " + " | ".join(str(cell(rows[a])) for a in arms) + " |")
    return "\n".join(lines)
