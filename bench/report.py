"""Turn the runs into figures (median and spread), ratios within each run, and targets.

Every row compares a subject with a baseline measured in the same run. A ratio
is taken per run and then summarized, so a run that was slow for everyone
(another job on the machine) moves both sides together and leaves it alone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Row:
    figure: str  # key in each run's per-subject dict
    label: str
    unit: str
    subject: str
    baseline: str
    # A target on the ratio subject/baseline ("max" or "min"), or on the subject alone.
    target_kind: Literal["ratio_max", "ratio_min", "value_max", "none"] = "none"
    target: float = 0.0
    scale: float = 1.0  # shown value = measured * scale (bytes -> MB)


ROWS = (
    Row("roundtrip_p50_us", "1. round trip p50", "µs", "clienttools", "rawjs", "ratio_max", 1.2),
    Row("roundtrip_p99_us", "1. round trip p99", "µs", "clienttools", "rawjs", "ratio_max", 1.5),
    Row("throughput_per_s", "2. throughput, pipelined", "invokes/s", "clienttools", "rawjs",
        "ratio_min", 0.8),
    Row("cold_start_ms", "3. cold start", "ms", "clienttools", "pydantic", "ratio_max", 1.10),
    Row("warm_start_ms", "3. warm start (HTTP cache)", "ms", "clienttools", "pydantic"),
    Row("cold_after_runtime_ms", "3. cold start once Pyodide is up", "ms", "clienttools",
        "pydantic"),
    Row("memory_growth_bytes", "4. JS heap + wasm growth per 10k invokes", "MB", "clienttools",
        "bare", "value_max", 5.0, 1e-6),
    Row("per_invoke_ms", "5. server, wall time per invoke", "ms", "ledger_on", "ledger_off",
        "ratio_max", 1.5),
    Row("server_cpu_per_invoke_ms", "5. server, CPU time per invoke", "ms", "ledger_on",
        "ledger_off", "ratio_max", 1.5),
    # Figure 6 has no baseline: it is the growth of one server over a long stretch.
    Row("rss_growth_bytes", "6. server RSS growth after warm-up, no --db", "MB",
        "server_memory", "", "value_max", 5.0, 1e-6),
    Row("rss_end_bytes", "6. server RSS at the end, no --db", "MB", "server_memory", "",
        scale=1e-6),
    # The SDK page against the floor Pyodide itself sets (bare Pyodide): the goals the
    # SDK can meet, where raw JS is out of reach for any Python in Pyodide.
    Row("roundtrip_p50_us", "1. round trip p50, against bare Pyodide", "µs", "clienttools",
        "bare", "ratio_max", 1.2),
    Row("roundtrip_p99_us", "1. round trip p99, against bare Pyodide", "µs", "clienttools",
        "bare", "ratio_max", 1.5),
    Row("throughput_per_s", "2. throughput, against bare Pyodide", "invokes/s", "clienttools",
        "bare", "ratio_min", 1.0),
    # The floor that Pyodide itself sets, for reading the rows above.
    Row("roundtrip_p50_us", "1. round trip p50 (bare Pyodide)", "µs", "bare", "rawjs"),
    Row("roundtrip_p99_us", "1. round trip p99 (bare Pyodide)", "µs", "bare", "rawjs"),
    Row("throughput_per_s", "2. throughput (bare Pyodide)", "invokes/s", "bare", "rawjs"),
    Row("memory_growth_bytes", "4. memory growth (raw JS)", "MB", "rawjs", "bare",
        scale=1e-6),
    Row("py_objects_growth", "4. Python objects tracked by gc, growth per 10k", "objects",
        "clienttools", "bare"),
    # The MicroPython flavour (micropython.html): its start against the Pyodide SDK page,
    # its invokes against raw JS.
    Row("cold_start_ms", "3. cold start, MicroPython flavour", "ms", "micropython",
        "clienttools", "ratio_max", 0.12),
    Row("warm_start_ms", "3. warm start, MicroPython flavour", "ms", "micropython",
        "clienttools"),
    Row("roundtrip_p50_us", "1. round trip p50, MicroPython flavour", "µs", "micropython",
        "rawjs", "ratio_max", 1.5),
    Row("roundtrip_p99_us", "1. round trip p99, MicroPython flavour", "µs", "micropython",
        "rawjs"),
    Row("throughput_per_s", "2. throughput, MicroPython flavour", "invokes/s", "micropython",
        "rawjs"),
    Row("throughput_per_s", "2. throughput, MicroPython flavour, against bare Pyodide",
        "invokes/s", "micropython", "bare", "ratio_min", 0.8),
)  # fmt: skip


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def _value(run: dict[str, dict[str, Any]], subject: str, figure: str) -> float | None:
    value = run.get(subject, {}).get(figure)
    return float(value) if isinstance(value, int | float) else None


def summarize(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The rows: per-run values, their medians and spreads, per-run ratios, target verdicts."""
    rows = []
    for row in ROWS:
        subject, baseline, ratios = [], [], []
        for run in runs:
            s, b = _value(run, row.subject, row.figure), _value(run, row.baseline, row.figure)
            if s is not None:
                subject.append(s)
            if b is not None:
                baseline.append(b)
            if s is not None and b:
                ratios.append(s / b)
        if not subject:
            continue
        entry: dict[str, Any] = {
            "figure": row.figure,
            "label": row.label,
            "unit": row.unit,
            "scale": row.scale,
            "subject": row.subject,
            "baseline": row.baseline,
            "subject_values": subject,
            "baseline_values": baseline,
            "ratios": ratios,
            "subject_stats": _spread(subject),
            "baseline_stats": _spread(baseline),
            "ratio_stats": _spread(ratios),
        }
        if row.target_kind != "none":
            entry["target"] = {"kind": row.target_kind, "limit": row.target}
            entry["met"] = _met(row, entry)
        rows.append(entry)
    return {"rows": rows}


def _met(row: Row, entry: dict[str, Any]) -> bool | None:
    if row.target_kind == "value_max":
        return bool(entry["subject_stats"]["median"] * row.scale <= row.target)
    ratio = entry["ratio_stats"]
    if ratio is None:
        return None
    if row.target_kind == "ratio_max":
        return bool(ratio["median"] <= row.target)
    return bool(ratio["median"] >= row.target)


def _fmt(stats: dict[str, float] | None, scale: float = 1.0, digits: int | None = None) -> str:
    if stats is None:
        return "n/a"
    median, low, high = (stats[k] * scale for k in ("median", "min", "max"))
    if digits is None:
        digits = 0 if abs(median) >= 100 else 2 if abs(median) < 10 else 1
    if stats["n"] == 1:
        return f"{median:,.{digits}f}"
    return f"{median:,.{digits}f} [{low:,.{digits}f}..{high:,.{digits}f}]"


def _target_text(entry: dict[str, Any]) -> str:
    target = entry.get("target")
    if target is None:
        return ""
    kind, limit = target["kind"], target["limit"]
    text = {"ratio_max": f"≤ {limit:g}x", "ratio_min": f"≥ {limit:g}x"}.get(
        kind, f"< {limit:g} {entry['unit']}"
    )
    met = entry.get("met")
    return f"{text} {'met' if met else 'MISSED' if met is False else '?'}"


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    settings = meta.get("settings", {})
    lines = [
        "# clienttools benchmark results",
        "",
        f"{meta.get('started', '?')}, {settings.get('runs', '?')} run(s)"
        f"{' (quick smoke: tiny N, not comparable)' if meta.get('quick') else ''}, "
        f"{meta.get('duration_s', '?')} s, {meta.get('cpus', '?')} CPUs, "
        f"load average at the end {_load(meta.get('load_average'))}.",
        "",
        "Values: median [min..max] over runs. Ratio = subject / baseline, taken within each run.",
        "",
        "| figure | subject | value | baseline | baseline value | ratio | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in results["rows"]:
        unit = entry["unit"]
        scale = entry["scale"]
        baseline = entry["baseline"]
        lines.append(
            f"| {entry['label']} ({unit}) | {entry['subject']} | "
            f"{_fmt(entry['subject_stats'], scale)} | {baseline} | "
            f"{_fmt(entry['baseline_stats'], scale) if baseline else ''} | "
            f"{_fmt(entry['ratio_stats'], digits=2) if baseline else ''} | "
            f"{_target_text(entry)} |"
        )
    lines += [
        "",
        "Subjects: clienttools = page (a), the SDK with one trivial tool; rawjs = page (b), a "
        "hand-written JS handler; bare = page (c), Pyodide answering with json.loads/json.dumps; "
        "pydantic = the bare page that first loads pydantic and defines one model (cold-start "
        "baseline); "
        "ledger_on/off = the reference server with/without `--db`; server_memory = one "
        "server without `--db` over many chats (figure 6).",
        "",
    ]
    return "\n".join(lines)


def _load(value: Any) -> str:
    if not value:
        return "?"
    return " ".join(f"{x:.2f}" for x in value)
