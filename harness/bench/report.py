"""Text tables and bar charts for results. Framework-neutral: no TensorFlow here.

matplotlib is imported only when a chart is drawn, and drawn on an Agg canvas of
its own, so charts work headless and leave pyplot's global state alone.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.bench.results import write_bytes_atomic
from harness.errors import InvalidValue
from harness.extras import require

__all__ = ["bar_chart", "curve_chart", "format_table", "ratio_to_best"]


def _matplotlib():
    """matplotlib's Agg canvas and Figure classes; ``MissingExtra`` (naming ``[bench]``) without matplotlib."""
    require("matplotlib", package="matplotlib", extra="bench", purpose="charts")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    return FigureCanvasAgg, Figure

_NUMBER = re.compile(r"^[-+]?(\d[\d,_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*(%|x|×)?$")
_PLACEHOLDERS = {"", "-", "—", "n/a"}
_BAR = "#a9c4e2"
_BEST = "#2a6fbb"
_MISSING = "#777777"


def format_table(rows: Sequence[Sequence[Any]], headers: Sequence[str], align: str | None = None) -> str:
    """Formats rows as a monospace table with a header rule.

    Args:
        rows: one sequence of cells per row, as many cells as headers. Cells are shown
            with ``str``; format floats yourself for control. ``None`` shows as ``-``.
        headers: the column titles.
        align: one letter per column, ``l`` (left), ``r`` (right) or ``c`` (centre).
            Default: right for columns whose cells are all numbers (or strings that
            read as numbers, like ``"2,123"`` or ``"1.17x"``), left otherwise.

    Returns:
        The table, lines joined by newlines, no trailing spaces or newline.

    Raises:
        ValueError: a row has the wrong number of cells, or ``align`` is malformed.

    Example:
        >>> print(format_table([["gpu:0", 1345], ["gpu:1", 875]], ["device", "samples/s"]))
        device  samples/s
        ------  ---------
        gpu:0        1345
        gpu:1         875
    """
    headers = [str(h) for h in headers]
    cells = []
    for index, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or len(row) != len(headers):
            raise InvalidValue(f"each row needs {len(headers)} cells (one per header {headers}); "
                               f"got row {index}={row!r}")
        cells.append([_cell_text(cell) for cell in row])
    columns = list(zip(*rows)) if rows else [()] * len(headers)
    if align is None:
        align = "".join("r" if _is_numeric_column(column) else "l" for column in columns)
    if len(align) != len(headers) or set(align) - set("lrc"):
        raise InvalidValue(f"align must be one of l, r, c per column ({len(headers)} columns); got align={align!r}")
    widths = [max([len(h), *(len(r[j]) for r in cells)]) for j, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *cells]
    return "\n".join(_join(line, widths, align) for line in lines)


def ratio_to_best(values: Sequence[float | None]) -> list[float | None]:
    """Each value divided by the largest (so the best is 1.0).

    Args:
        values: finite numbers; ``None`` for a missing one (e.g. a failed run).

    Returns:
        One ratio per value; ``None`` where the value is ``None``, and everywhere
        when no value is positive.

    Raises:
        ValueError: a value is NaN, infinite or not a number.
    """
    checked = _check_values(values, None, "values")
    present = [v for v in checked if v is not None]
    best = max(present, default=0.0)
    if best <= 0:
        return [None] * len(checked)
    return [None if v is None else v / best for v in checked]


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float | None],
    path: Path | str,
    *,
    title: str,
    ylabel: str = "samples/s",
    notes: Sequence[str | None] | None = None,
    highlight_best: bool = True,
    errors: Sequence[float | None] | None = None,
    footnote: str | None = None,
    horizontal: bool | None = None,
) -> Path:
    """Draws one bar per label, the value printed on each bar, and saves it atomically.

    Args:
        labels: the bar names.
        values: one finite number per bar; ``None`` leaves an empty slot labelled by
            its note (default ``"failed"``).
        path: the image file; the format follows its suffix (``.png`` usually).
        title: the chart title.
        ylabel: the value axis label.
        notes: one note per bar or ``None``: the text of an empty slot (e.g. ``"OOM"``),
            else shown after the value.
        highlight_best: colour the largest value's bar.
        errors: one error-bar half-width per bar, in the values' units (for a median
            with interquartile range, ``iqr / 2``), or ``None`` for no error bar.
        footnote: small text under the chart, e.g. ``"emulated devices"``.
        horizontal: bars along x; default when there are many bars or long labels.

    Returns:
        ``path`` as a Path.

    Raises:
        ValueError: the sequences' lengths differ, there are no bars, a value is not
            finite, or an error is negative.

    Example:
        ``bar_chart(["even", "58/42"], [1810.0, 2123.0], out / "split.png", title="1080 Ti + 1080")``
    """
    labels = [str(label) for label in labels]
    if not labels:
        raise InvalidValue("bar_chart needs at least one bar; got labels=[]")
    checked = _check_values(values, len(labels), "values")
    spreads = _check_values(errors, len(labels), "errors") if errors is not None else [None] * len(labels)
    if any(e is not None and e < 0 for e in spreads):
        raise InvalidValue(f"errors must be >= 0; got errors={list(spreads)!r}")
    texts = _check_notes(notes, len(labels))
    if horizontal is None:
        horizontal = len(labels) > 6 or max(len(label) for label in labels) > 12

    FigureCanvasAgg, Figure = _matplotlib()

    n = len(labels)
    size = (7.0, max(2.5, 0.45 * n + 1.4)) if horizontal else (max(4.0, 0.9 * n + 1.6), 4.0)
    figure = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    best = _best_index(checked) if highlight_best else None
    _draw_bars(axes, checked, spreads, best, horizontal)
    _label_bars(axes, checked, spreads, texts, best, horizontal)
    _set_axes(axes, labels, title, ylabel, horizontal)
    return _save(figure, path, footnote, 0.06)


def curve_chart(curves: Sequence[dict], path: Path | str, *, title: str, footnote: str | None = None) -> Path:
    """Samples/s against batch size, one colour per device: measured points, fitted curve, ceiling, choice.

    Args:
        curves: one dict per device: ``label``, ``points`` (``[(batch, samples/s)]``),
            ``fit`` (``(fixed_s, per_sample_s)`` or None), ``ceiling`` (int or None),
            ``chosen`` (``(batch, samples/s)`` or None), optional ``ceiling_label``
            (default ``"ceiling N"``; e.g. ``"probed to N"`` when no OOM was reached).
        path: the image file (``.png``).
        title: the chart title.
        footnote: small text under the chart.

    Returns:
        ``path`` as a Path.
    """
    if not curves:
        raise InvalidValue("curve_chart needs at least one curve; got none")
    FigureCanvasAgg, Figure = _matplotlib()

    figure = Figure(figsize=(8.5, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    top = max([c["ceiling"] or 0 for c in curves] + [b for c in curves for b, _ in c["points"]] + [2])
    for i, curve in enumerate(curves):
        colour = f"C{i}"
        if curve.get("fit"):
            fixed, per_sample = curve["fit"]
            xs = [1 + (top * 1.05 - 1) * k / 200 for k in range(201)]
            axes.plot(xs, [x / (fixed + x * per_sample) for x in xs], color=colour, alpha=0.6, lw=1.2)
        if curve["points"]:
            bx, by = zip(*curve["points"])
            axes.plot(bx, by, "o", color=colour, label=curve["label"], ms=5)
        if curve.get("ceiling"):
            probed = curve.get("ceiling_label", "").startswith("probed")
            axes.axvline(curve["ceiling"], color=colour, ls=":" if probed else "--", lw=1)
            text = curve.get("ceiling_label") or f"ceiling {curve['ceiling']}"
            axes.annotate(text, (curve["ceiling"], 0), xytext=(-3, 3 + 12 * i), textcoords="offset points",
                          color=colour, fontsize=8, ha="right")
        if curve.get("chosen"):
            axes.plot(*curve["chosen"], marker="*", ms=16, color=colour, markeredgecolor="black")
    axes.plot([], [], "*", color="gray", markeredgecolor="black", ms=12, label="chosen batch")
    axes.set_xlim(0, top * 1.08)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("batch size on the device")
    axes.set_ylabel("samples/s, device alone")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(figure, path, footnote, 0.05)


def _save(figure, path: Path | str, footnote: str | None, footnote_height: float) -> Path:
    """Lays out ``figure`` (room for the footnote), adds the footnote, writes it atomically in ``path``'s format."""
    figure.tight_layout(rect=(0, footnote_height if footnote else 0, 1, 1))
    if footnote:
        figure.text(0.01, 0.01, footnote, fontsize=8, color="dimgray", ha="left", va="bottom")
    path = Path(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png")
    return write_bytes_atomic(path, buffer.getvalue())


def _cell_text(cell: Any) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, float):
        return format(cell, "g")
    return str(cell)


def _is_numeric_column(column: Sequence[Any]) -> bool:
    seen = False
    for cell in column:
        if cell is None or (isinstance(cell, str) and cell.strip() in _PLACEHOLDERS):
            continue
        if isinstance(cell, bool):
            return False
        if not isinstance(cell, (int, float)) and not (isinstance(cell, str) and _NUMBER.match(cell.strip())):
            return False
        seen = True
    return seen


def _join(cells: Sequence[str], widths: Sequence[int], align: str) -> str:
    pad = {"l": str.ljust, "r": str.rjust, "c": str.center}
    return "  ".join(pad[a](c, w) for c, w, a in zip(cells, widths, align)).rstrip()


def _check_values(values: Sequence[float | None], count: int | None, name: str) -> list[float | None]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidValue(f"{name} must be a list of numbers or None; got {name}={values!r}")
    if count is not None and len(values) != count:
        raise InvalidValue(f"{name} must have one entry per bar ({count} bars); got {len(values)}: {name}={values!r}")
    checked: list[float | None] = []
    for value in values:
        if value is None:
            checked.append(None)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidValue(f"{name} must be finite numbers or None (for missing); got {name}={list(values)!r}")
        else:
            checked.append(float(value))
    return checked


def _check_notes(notes: Sequence[str | None] | None, count: int) -> list[str | None]:
    if notes is None:
        return [None] * count
    if isinstance(notes, str) or len(notes) != count:
        raise InvalidValue(f"notes must have one entry per bar ({count} bars); got notes={notes!r}")
    return [None if note is None else str(note) for note in notes]


def _best_index(values: Sequence[float | None]) -> int | None:
    present = [(v, -i) for i, v in enumerate(values) if v is not None]
    return -max(present)[1] if present else None  # the first of equal bests


def _format_value(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _draw_bars(axes, values, errors, best, horizontal: bool) -> None:
    positions = range(len(values))
    heights = [0.0 if v is None else v for v in values]
    colors = [_BEST if i == best else _BAR for i in positions]
    draw = axes.barh if horizontal else axes.bar
    draw(positions, heights, color=colors, edgecolor="none")
    with_error = [i for i in positions if values[i] is not None and errors[i]]
    if with_error:
        at, tops = with_error, [values[i] for i in with_error]
        spans = [errors[i] for i in with_error]
        if horizontal:
            axes.errorbar(tops, at, xerr=spans, fmt="none", ecolor="black", elinewidth=1, capsize=3)
        else:
            axes.errorbar(at, tops, yerr=spans, fmt="none", ecolor="black", elinewidth=1, capsize=3)


def _label_bars(axes, values, errors, notes, best, horizontal: bool) -> None:
    for i, value in enumerate(values):
        if value is None:
            text, end, style = notes[i] or "failed", 0.0, {"color": _MISSING, "style": "italic"}
        else:
            text = _format_value(value) + (f" ({notes[i]})" if notes[i] else "")
            end = value + (errors[i] or 0.0) * (1 if value >= 0 else -1)
            style = {"fontweight": "bold"} if i == best else {}
        sign = 1 if value is None or value >= 0 else -1  # text goes past the bar's end
        place: dict[str, Any]  # keyword arguments for annotate
        if horizontal:
            place = {"xy": (end, i), "xytext": (3 * sign, 0), "ha": "left" if sign > 0 else "right", "va": "center"}
        else:
            place = {"xy": (i, end), "xytext": (0, 3 * sign), "ha": "center", "va": "bottom" if sign > 0 else "top"}
        axes.annotate(text, textcoords="offset points", fontsize=8, **place, **style)


def _set_axes(axes, labels, title: str, ylabel: str, horizontal: bool) -> None:
    positions = list(range(len(labels)))
    axes.set_title(title)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    if horizontal:
        axes.set_yticks(positions)
        axes.set_yticklabels(labels)
        axes.invert_yaxis()  # first label on top, as in a table
        axes.set_xlabel(ylabel)
        axes.margins(x=0.2)
    else:
        long_labels = max(len(label) for label in labels) > 8
        axes.set_xticks(positions)
        axes.set_xticklabels(labels, rotation=30 if long_labels else 0, ha="right" if long_labels else "center")
        axes.set_ylabel(ylabel)
        axes.margins(y=0.15)
