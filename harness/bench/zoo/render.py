"""The conformance table as text, Markdown and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from harness.bench.zoo.catalog import ON_JAX
from harness.bench.zoo.runner import ALL_SPLITS, KINDS, METHODS, ZooRow, count, finite, kind_of

__all__ = ["text_table", "markdown", "to_json", "from_json", "summary", "overview", "keras_label"]


def keras_label(keras: str) -> str:
    """A row's ``keras`` as tables show it: ``"3"``, ``"2"``, and ``"3 on JAX"`` for Keras 3 on JAX (``ON_JAX``; the
    pins and the JSON keep ``"jax"``)."""
    return "3 on JAX" if keras == ON_JAX else keras

# floor: the rounding floor (one device vs one device in other summation orders: harness.equivalence.FLOOR_ORDERS,
# in the run's own precision); f64: distance from
# the float64 run of one device (one float32 device; the parallel float32 run; the parallel model trained in float64).
_HEADER = ("model", "keras", "method", "split", "max dev", "loss dev", "floor", "f64: 1 dev", "f64: par", "f64: par64",
           "s", "status")


def _header(rows: Sequence[ZooRow]) -> tuple[str, ...]:
    """The columns; an ``optimizer`` column after the model where a row is of the optimizer axis."""
    return _HEADER[:1] + ("optimizer",) + _HEADER[1:] if any(r.optimizer for r in rows) else _HEADER


def _cells(row: ZooRow, header: tuple[str, ...]) -> tuple[str, ...]:
    def figure(value: float | None) -> str:
        return "-" if value is None else f"{value:.2e}"

    label = (row.optimizer or "-",) if "optimizer" in header else ()
    return (row.model, *label, keras_label(row.keras), row.method, row.split, figure(row.max_deviation),
            figure(row.loss_deviation), figure(row.floor), figure(row.reference_single), figure(row.reference_parallel),
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
    return "\n".join(lines + ["", summary(rows)] + _tracebacks(rows))


def _tracebacks(rows: Sequence[ZooRow]) -> list[str]:
    """The whole traceback of each case that raised something other than a refusal."""
    return [f"\n{r.model} ({r.optimizer + ', ' if r.optimizer else ''}Keras {keras_label(r.keras)}, {r.method}, "
            f"{r.split}) raised:\n{r.traceback.rstrip()}" for r in rows if r.traceback]


def markdown(rows: Sequence[ZooRow]) -> str:
    """A Markdown table and the summary line."""
    def escape(cell: str) -> str:
        return cell.replace("|", "\\|")

    header = _header(rows)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in _cells(r, header)) + " |" for r in rows]
    return "\n".join(lines + ["", summary(rows)])


_FIGURES = ("max_deviation", "loss_deviation", "reference_single", "reference_parallel", "reference_exact", "floor",
            "floor_multiple")


def to_json(rows: Sequence[ZooRow], stamp: str = "") -> str:
    """``{"rows": [...], "summary": {...}, "stamp": ...}``; figures that are missing or not finite are null;
    ``stamp``: where the rows came from (the command, commit and versions)."""
    records = [{**asdict(r), **{f: finite(getattr(r, f)) for f in _FIGURES}, "failed": r.failed} for r in rows]
    return json.dumps({"rows": records, "summary": count(rows), "stamp": stamp}, indent=2)


def from_json(text: str) -> tuple[list[ZooRow], str]:
    """The rows and stamp of ``to_json``'s output (``harness check --zoo --format json``).

    Raises:
        InvalidValue: not such a JSON document.
    """
    from dataclasses import fields

    from harness.errors import InvalidValue

    try:
        data = json.loads(text)
        names = {f.name for f in fields(ZooRow)}
        rows = [ZooRow(**{k: v for k, v in record.items() if k in names}) for record in data["rows"]]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise InvalidValue(f"not the JSON of harness check --zoo --format json: {type(err).__name__}: {err}") from err
    return rows, str(data.get("stamp") or "")


_SHORT = {"exact": "exact", "as accurate as one device": "as accurate", "refused": "refused", "FAIL": "FAIL"}


def overview(rows: Sequence[ZooRow], stamp: str = "") -> str:
    """The zoo's Markdown overview, one line per model and Keras: its public definition, each method's kinds over
    the splits, the worst deviation from one device and the largest multiple of its rounding floor; the
    optimizer axis as counts per option; the summary; ``stamp`` (the command, commit and versions) below.
    This is the table docs/zoo.md shows, written by ``harness check --zoo --format overview``."""
    from harness.bench.zoo.catalog import CATALOG

    sources = {e.name: e.source for e in CATALOG}
    models = [r for r in rows if not r.optimizer]
    lines = []
    if models:
        methods = [m for m in METHODS if any(r.method == m for r in models)]
        splits = [s for s in ALL_SPLITS if any(r.split == s for r in models)]
        lines += ["| model | keras | public definition | " + " | ".join(f"{m} ({', '.join(splits)})" for m in methods)
                  + " | worst dev. from one device | dev. / rounding floor |",
                  "|---" * (5 + len(methods)) + "|"]
        for model, keras in dict.fromkeys((r.model, r.keras) for r in models):
            own = [r for r in models if (r.model, r.keras) == (model, keras)]
            cells = []
            for method in methods:
                kinds = [_SHORT[kind_of(r.status)] for r in sorted(own, key=lambda r: splits.index(r.split))
                         if r.method == method]
                cells.append("-" if not kinds else kinds[0] if len(set(kinds)) == 1 else ", ".join(kinds))
            devs = [d for d in (finite(r.max_deviation) for r in own) if d is not None]
            multiples = [m for m in (finite(r.floor_multiple) for r in own) if m is not None]
            worst = f"{max(devs):.1e}" if devs else "-"
            multiple = f"{max(multiples):.2g}" if multiples else "-"
            lines.append(f"| {model} | {keras_label(keras)} | {sources.get(model, '-')} | " + " | ".join(cells)
                         + f" | {worst} | {multiple} |")
        lines.append("")
    axis = [r for r in rows if r.optimizer]
    if axis:
        options = list(dict.fromkeys((r.keras, r.optimizer.split("/", 1)[1]) for r in axis))
        lines += ["| keras | option | cases | " + " | ".join(_SHORT[k] for k in KINDS) + " |",
                  "|---" * (3 + len(KINDS)) + "|"]
        for keras, option in options:
            own = [r for r in axis if r.keras == keras and r.optimizer.endswith("/" + option)]
            counted = count(own)
            lines.append(f"| {keras} | {option} | {len(own)} | " + " | ".join(str(counted[k]) for k in KINDS) + " |")
        lines.append("")
    lines.append(summary(rows) + ".")
    if stamp:
        lines += ["", stamp]
    return "\n".join(lines) + "\n"
