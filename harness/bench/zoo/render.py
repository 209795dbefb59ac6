"""The conformance table as text, Markdown and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from harness.bench.zoo.runner import ZooRow, count, finite

__all__ = ["text_table", "markdown", "to_json", "summary"]

# f64: distance from the float64 run of one device (one float32 device; the parallel float32 run; the
# parallel model trained in float64).
_HEADER = ("model", "keras", "method", "split", "max dev", "loss dev", "f64: 1 dev", "f64: par", "f64: par64", "s",
           "status")


def _header(rows: Sequence[ZooRow]) -> tuple[str, ...]:
    """The columns; an ``optimizer`` column after the model where a row is of the optimizer axis."""
    return _HEADER[:1] + ("optimizer",) + _HEADER[1:] if any(r.optimizer for r in rows) else _HEADER


def _cells(row: ZooRow, header: tuple[str, ...]) -> tuple[str, ...]:
    def figure(value: float | None) -> str:
        return "-" if value is None else f"{value:.2e}"

    label = (row.optimizer or "-",) if "optimizer" in header else ()
    return (row.model, *label, row.keras, row.method, row.split, figure(row.max_deviation),
            figure(row.loss_deviation), figure(row.reference_single), figure(row.reference_parallel),
            figure(row.reference_exact), f"{row.seconds:.1f}", row.status)


def summary(rows: Sequence[ZooRow]) -> str:
    """``N cases of M models: a exact, b as accurate as one device, ..., d FAIL``."""
    kinds = count(rows)
    models = len({(r.model, r.keras) for r in rows})
    settings = len({(r.model, r.keras, r.optimizer) for r in rows if r.optimizer})
    what = f"{models} models" + (f" ({settings} optimizer settings)" if settings else "")
    return f"{len(rows)} cases of {what}: " + ", ".join(f"{n} {kind}" for kind, n in kinds.items())


def text_table(rows: Sequence[ZooRow]) -> str:
    """A fixed-width table, one line per case, and the summary line."""
    header = _header(rows)
    table = [header] + [_cells(r, header) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1] for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ------")
    return "\n".join(lines + ["", summary(rows)])


def markdown(rows: Sequence[ZooRow]) -> str:
    """A Markdown table and the summary line."""
    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    header = _header(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in _cells(r, header)) + " |" for r in rows]
    return "\n".join(lines + ["", summary(rows)])


def to_json(rows: Sequence[ZooRow]) -> str:
    """``{"rows": [...], "summary": {...}}``; figures that are missing or not finite are null."""
    figures = ("max_deviation", "loss_deviation", "reference_single", "reference_parallel", "reference_exact")
    records = [{**asdict(r), **{f: finite(getattr(r, f)) for f in figures}, "failed": r.failed} for r in rows]
    return json.dumps({"rows": records, "summary": count(rows)}, indent=2)
