"""One self-contained HTML page of a history's change points: each stepped series drawn with its steps marked.

:func:`render` draws every benchmark combination in which
:func:`~harness.ci.tracking.regressions.find_changes` found a regression, an
improvement or a drift as an inline SVG plot: the measured values along the
commits, the fitted levels, each step's 95% range (last good..first bad) as a
band and its likely commit as a line; standing regressions red, fixed ones
orange with the fixing commit marked, improvements green. Inline CSS and SVG, no
script, no external URL: it renders offline (``harness dashboard`` writes it
beside asv's pages). Standard library only.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.ci.tracking.changepoints import Fit
    from harness.ci.tracking.history import History, Series
    from harness.ci.tracking.regressions import Change, Changes, SeriesDrift

__all__ = ["COLORS", "render", "format_value"]

COLORS = {"standing": "#d62728", "fixed": "#e67e00", "improvement": "#2ca02c"}  # by a step's status, or kind
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 960, 260, 64, 20, 24, 34  # the plot's box, in SVG units
_SECONDS = ((1e-9, " ns"), (1e-6, " μs"), (1e-3, " ms"), (1.0, " s"))
_BYTES = ((1.0, " B"), (1e3, " kB"), (1e6, " MB"), (1e9, " GB"), (1e12, " TB"))
_SI = ((1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"))
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#222;
  max-width:1000px;margin:0 auto;padding:12px 16px}
h1{font-size:21px;margin:6px 0}h2{font-size:15px;margin:0 0 2px;overflow-wrap:anywhere}
code{font:12px ui-monospace,"DejaVu Sans Mono",monospace}
table{border-collapse:collapse;width:100%;font-size:13px;margin:8px 0}
th,td{border-bottom:1px solid #e3e3e3;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f6f6f6}a{color:#1f5fa8}td.n{white-space:nowrap}
.meta{color:#555;margin:2px 0}.counts b{margin-right:2px}
.panel{border:1px solid #ddd;border-radius:4px;padding:8px 12px;margin:14px 0}
ul.changes{margin:2px 0 4px;padding-left:18px}
.standing .what{color:#d62728}.fixed .what{color:#b86200}.improvement .what{color:#23862a}
svg.plot{display:block;width:100%;height:auto}svg text{font-size:11px;fill:#444;font-family:sans-serif}
.legend{font-size:12px;color:#444}.legend span{margin-right:14px;white-space:nowrap}
.legend svg{vertical-align:middle;margin-right:3px}.quiet{color:#555}
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _scale(unit: str, magnitude: float) -> tuple[float, str, str]:
    """``(divisor, suffix of a tick, suffix of a value)`` for values of about ``magnitude`` in ``unit``."""
    scales = {"seconds": _SECONDS, "bytes": _BYTES}.get(unit)
    named = "" if unit in ("", "unit") else f" {unit}"
    table = [(f, s, s) for f, s in scales] if scales else [(f, s, s + named) for f, s in _SI]
    if not (magnitude > 0 and math.isfinite(magnitude)):
        return next(entry for entry in table if entry[0] == 1.0)
    return next((entry for entry in reversed(table) if magnitude >= entry[0] * (1 - 1e-9)), table[0])


def format_value(value: float | None, unit: str) -> str:
    """``value`` in ``unit`` for a person, 4 significant digits: seconds as ns/μs/ms/s, bytes as B/kB/MB/GB,
    other units with k/M/G.

    Example:
        >>> format_value(0.004123, "seconds"), format_value(2400.0, "samples/s"), format_value(None, "bytes")
        ('4.123 ms', '2.4k samples/s', 'failed')
    """
    if value is None:
        return "failed"
    if not math.isfinite(value):
        return "skipped" if math.isnan(value) else str(value)
    divisor, _, suffix = _scale(unit, abs(value))
    return f"{value / divisor:.4g}{suffix}"


def _tick_label(value: float, unit: str, step: float, magnitude: float) -> str:
    """A tick's text: the scale of the axis' largest tick, as many decimals as the ticks' ``step`` needs."""
    divisor, suffix, _ = _scale(unit, magnitude)
    scaled = step / divisor
    decimals = next((d for d in range(7) if abs(round(scaled, d) - scaled) <= 1e-9 * abs(scaled)), 6)
    return f"{value / divisor:.{decimals}f}{suffix}"


def _ticks(low: float, high: float, count: int = 5) -> tuple[float, list[float]]:
    """Round values (1, 2, 2.5 or 5 times a power of ten apart) from below ``low`` to above ``high``, and their
    step."""
    if not high > low:
        half = abs(high) * 0.05 or 0.5
        low, high = low - half, high + half
    raw = (high - low) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    return step, [i * step for i in range(first, last + 1)]


@dataclass(frozen=True)
class _Frame:
    """The plot's data ranges: commit positions ``x0``..``x1`` and values ``y0``..``y1``, mapped to SVG units."""

    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, position: float) -> float:
        return round(_LEFT + (position - self.x0) / (self.x1 - self.x0) * (_WIDTH - _LEFT - _RIGHT), 1)

    def y(self, value: float) -> float:
        return round(_HEIGHT - _BOTTOM - (value - self.y0) / (self.y1 - self.y0) * (_HEIGHT - _TOP - _BOTTOM), 1)


def _positions(history: History, series: Series) -> list[int]:
    """Each commit of ``series`` as its position along the history's order (its index where one is missing)."""
    found = [history.position(commit) for commit in series.commits]
    return found if min(found, default=0) >= 0 else list(range(len(found)))


def _levels(series: Series, fit: Fit | None, positions: list[int]) -> list[tuple[int, int, float]]:
    """The fitted levels as ``(first position, last position, level in the benchmark's unit)``."""
    kept = series.usable()
    return [(positions[kept[a]], positions[kept[b - 1]], 1 / level if series.higher_is_better and level else level)
            for a, b, level in (fit.levels if fit else ()) if b > a]


def _axes(frame: _Frame, series: Series, positions: list[int], ticks: list[float], step: float) -> list[str]:
    """The frame, the value grid with its labels, a few commits along x, and the unit."""
    bottom, right = _HEIGHT - _BOTTOM, _WIDTH - _RIGHT
    magnitude = max(abs(ticks[0]), abs(ticks[-1]))
    out = [f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{right - _LEFT}" height="{bottom - _TOP}" '
           'fill="#fff" stroke="#bbb"/>']
    for value in ticks:
        y = frame.y(value)
        out.append(f'<line class="grid" x1="{_LEFT}" x2="{right}" y1="{y}" y2="{y}" stroke="#eee"/>'
                   f'<text class="ytick" x="{_LEFT - 5}" y="{y}" dy="0.32em" text-anchor="end">'
                   f'{_e(_tick_label(value, series.unit, step, magnitude))}</text>')
    n = len(series.commits)
    picks = sorted({round(i * (n - 1) / 5) for i in range(6)}) if n > 1 else list(range(n))
    for i in picks:
        x = frame.x(positions[i])
        anchor = "end" if i == n - 1 and n > 1 else "middle"
        out.append(f'<line x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}" stroke="#888"/><text class="xtick" '
                   f'x="{x}" y="{bottom + 16}" text-anchor="{anchor}">{_e(series.commits[i][:8])}</text>')
    better = "higher" if series.higher_is_better else "lower"
    out.append(f'<text class="unit" x="{_LEFT}" y="{_TOP - 8}">{_e(series.unit)} ({better} is better)</text>'
               f'<text x="{right}" y="{_HEIGHT - 2}" text-anchor="end">commits, oldest to newest ({n} tested)'
               '</text>')
    return out


def _status(change: Change) -> str:
    """``standing``, ``fixed`` or ``improvement``: what picks a step's color."""
    return change.status.value if change.is_regression and change.status is not None else "improvement"


def _step(frame: _Frame, change: Change, at: dict[str, int]) -> str:
    """A step's 95% band and its likely commit's line (a fixed regression's fixing commit too), in a group
    whose class and data attributes name it."""
    if change.last_good not in at or change.first_bad not in at:
        return ""
    kind, status, given = change.kind.value, _status(change), change.status.value if change.status else ""
    color = COLORS[status]
    a, b = frame.x(at[change.last_good]), frame.x(at[change.first_bad])
    likely = frame.x(at.get(change.likely, at[change.first_bad]))
    bottom = _HEIGHT - _BOTTOM
    tip = f"{change.label}: {_what(change)}, {_describe(change)}; likely {change.likely[:8]}"
    out = [f'<g class="step {kind} {status}" data-kind="{kind}" data-status="{given}" '
           f'data-last-good="{change.last_good}" data-first-bad="{change.first_bad}" data-likely="{change.likely}" '
           f'data-ratio="{change.ratio:.4f}"><title>{_e(tip)}</title>',
           f'<rect class="band" x="{a}" y="{_TOP}" width="{max(b - a, 2.0)}" height="{bottom - _TOP}" '
           f'fill="{color}" fill-opacity="0.16"/>',
           f'<line class="likely" x1="{likely}" x2="{likely}" y1="{_TOP}" y2="{bottom}" stroke="{color}" '
           'stroke-width="2"/>',
           f'<text class="ratio" x="{likely + 3}" y="{_TOP + 12}" style="fill:{color}">{change.ratio:.2f}x</text>']
    if change.fixed_by and change.fixed_by in at:
        x = frame.x(at[change.fixed_by])
        out.append(f'<line class="fix" data-fixed-by="{change.fixed_by}" data-fixes="{change.first_bad}" x1="{x}" '
                   f'x2="{x}" y1="{_TOP}" y2="{bottom}" stroke="{color}" stroke-width="2" stroke-dasharray="6 4"/>'
                   f'<text class="fix" x="{x + 3}" y="{bottom - 6}" style="fill:{color}">fix</text>')
    return "".join(out) + "</g>"


def _data(frame: _Frame, series: Series, positions: list[int]) -> list[str]:
    """The measured values as a line with points (each with its commit as a tooltip), failed nights as crosses
    at the bottom; skipped nights are left out."""
    kept = series.usable()
    points = [(frame.x(positions[i]), frame.y(float(series.values[i])), i) for i in kept]  # type: ignore[arg-type]
    out = [f'<polyline class="values" fill="none" stroke="#8fb3d9" stroke-width="1.2" '
           f'points="{" ".join(f"{x},{y}" for x, y, _ in points)}"/>']
    out += [f'<circle class="value" cx="{x}" cy="{y}" r="2.4" fill="#1f5fa8"><title>'
            f'{series.commits[i][:8]}: {_e(format_value(series.values[i], series.unit))}</title></circle>'
            for x, y, i in points]
    low = _HEIGHT - _BOTTOM - 6
    for i, value in enumerate(series.values):
        if value is None:
            x = frame.x(positions[i])
            out.append(f'<path class="failed" data-commit="{series.commits[i]}" d="M{x - 3},{low - 3}L{x + 3},'
                       f'{low + 3}M{x - 3},{low + 3}L{x + 3},{low - 3}" stroke="#444" stroke-width="1.5">'
                       f'<title>{series.commits[i][:8]}: failed</title></path>')
    return out


def _plot(history: History, series: Series, fit: Fit | None, found: Sequence[Change]) -> str:
    """The series' SVG: grid and axes, the steps' bands and lines, the fitted levels, the measured values."""
    positions = _positions(history, series)
    levels = _levels(series, fit, positions)
    values = [float(series.values[i]) for i in series.usable()]  # type: ignore[arg-type]
    finite = [v for v in values + [level for _, _, level in levels] if math.isfinite(v)] or [0.0]
    pad = (max(finite) - min(finite)) * 0.04
    step, ticks = _ticks(min(finite) - pad, max(finite) + pad)
    left, right = min(positions, default=0), max(positions, default=1)
    margin = max(0.5, (right - left) * 0.01)
    frame = _Frame(left - margin, right + margin, ticks[0], ticks[-1])
    at = dict(zip(series.commits, positions))
    parts = _axes(frame, series, positions, ticks, step)
    parts += [_step(frame, c, at) for c in sorted(found, key=lambda c: c.is_regression)]  # regressions on top
    parts += [f'<line class="level" x1="{frame.x(a)}" x2="{frame.x(b)}" y1="{frame.y(v)}" y2="{frame.y(v)}" '
              f'stroke="#333" stroke-width="2.5"><title>level {_e(format_value(v, series.unit))}</title></line>'
              for a, b, v in levels if math.isfinite(v)]
    parts += _data(frame, series, positions)
    label = f"{_label(series)}: {len(values)} values along the commits, {len(found)} step(s) marked"
    return (f'<svg class="plot" viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{_e(label)}">'
            + "".join(parts) + "</svg>")


def _label(series: Series) -> str:
    return f"{series.name}({series.params})" if series.params else series.name


def _what(change: Change) -> str:
    return {"standing": "standing regression", "fixed": "fixed regression"}.get(_status(change), "improvement")


def _describe(change: Change) -> str:
    """How large the step is: ``1.13x worse (1.11-1.15)``, the bounds at 99%."""
    word = "worse" if change.is_regression else "better"
    return f"{change.ratio:.2f}x {word} ({change.low:.2f}-{change.high:.2f})"


def _change_line(change: Change) -> str:
    """One change of a panel, in words: what, how large, the levels, where."""
    text = (f'<span class="what">{_what(change)}</span>, {_describe(change)}: '
            f"{_e(format_value(change.before, change.unit))} → {_e(format_value(change.after, change.unit))}; "
            f"last good <code>{change.last_good[:8]}</code> .. first bad <code>{change.first_bad[:8]}</code> "
            f"({change.commits} commit{'s' * (change.commits != 1)}), likely <code>{change.likely[:8]}</code>")
    if change.fixed_by:
        text += f"; fixed by <code>{change.fixed_by[:8]}</code>"
    if change.fixes:
        text += f"; fixes the regression first bad at <code>{change.fixes[:8]}</code>"
    return f'<li class="{change.kind.value} {_status(change)}">{text}</li>'


def _legend(series: Series, found: Sequence[Change]) -> str:
    """The marks this panel shows, each with a small swatch."""
    def key(swatch: str, text: str) -> str:
        return f'<span><svg width="22" height="12" viewBox="0 0 22 12">{swatch}</svg>{_e(text)}</span>'

    shown = {_status(c) for c in found}
    items = [key('<line x1="0" x2="22" y1="6" y2="6" stroke="#8fb3d9"/><circle cx="11" cy="6" r="2.4" '
                 'fill="#1f5fa8"/>', f"measured ({series.unit})"),
             key('<line x1="0" x2="22" y1="6" y2="6" stroke="#333" stroke-width="2.5"/>', "fitted level")]
    if any(v is None for v in series.values):
        items.append(key('<path d="M8,3L14,9M8,9L14,3" stroke="#444" stroke-width="1.5"/>', "failed night"))
    for status, text in (("standing", "standing regression"), ("fixed", "fixed regression"),
                         ("improvement", "improvement")):
        if status in shown:
            items.append(key(f'<rect width="22" height="12" fill="{COLORS[status]}" fill-opacity="0.16"/><line '
                             f'x1="11" x2="11" y1="0" y2="12" stroke="{COLORS[status]}" stroke-width="2"/>',
                             f"{text}: 95% range, likely commit"))
    if any(c.fixed_by for c in found):
        items.append(key(f'<line x1="11" x2="11" y1="0" y2="12" stroke="{COLORS["fixed"]}" stroke-width="2" '
                         'stroke-dasharray="3 2"/>', "the commit that fixed it"))
    return f'<div class="legend">{"".join(items)}</div>'


def _panel(history: History, series: Series, fit: Fit | None, found: Sequence[Change], drift: SeriesDrift | None,
           anchor: str) -> str:
    """One benchmark combination: its name, its changes in words, its plot and legend."""
    lines = [_change_line(c) for c in found]
    if drift is not None:
        total = drift.drift.total
        lines.append(f'<li class="drift"><span class="what">slow drift</span>: {100 * abs(total):.1f}% '
                     f"{'worse' if total > 0 else 'better'} over {drift.commits} commits (a trend, not a step)</li>")
    return (f'<section class="panel" id="{anchor}" data-benchmark="{_e(series.name)}" data-params='
            f'"{_e(series.params)}">\n<h2>{_e(_label(series))}</h2>\n<ul class="changes">{"".join(lines)}</ul>\n'
            f"{_plot(history, series, fit, found)}\n{_legend(series, found)}\n</section>")


def _header(history: History, changes: Changes, factor: float, title: str) -> str:
    """The title, the history it covers and how many changes of each kind."""
    standing = len(changes.standing)
    counts = [(standing, "standing regression"), (len(changes.regressions) - standing, "fixed regression"),
              (len(changes.improvements), "improvement"), (len(changes.drifts), "drift")]
    first, last = history.commits[0], history.commits[-1]
    return (f"<h1>{_e(title)}</h1>\n<p class=\"meta\">machine <b>{_e(history.machine)}</b>, "
            f"{len(history.commits)} commits (<code>{first[:8]}</code>..<code>{last[:8]}</code>); order: "
            f"{_e(history.order)}; steps beyond {_e(f'{factor:g}')}x that stand out of each benchmark's noise</p>\n"
            '<p class="counts">' + ", ".join(f"<b>{n}</b> {word}{'s' * (n != 1)}" for n, word in counts) + "</p>")


def _row(change: Change, anchor: str) -> str:
    """A change's row of the summary table; its name links to its panel and may wrap after each dot."""
    cells = [f'<a href="#{anchor}">{_e(change.label).replace(".", ".<wbr>")}</a>', _what(change),
             _describe(change), f"{_e(format_value(change.before, change.unit))} → "
             f"{_e(format_value(change.after, change.unit))}",
             f"<code>{change.last_good[:8]}..{change.first_bad[:8]}</code> ({change.commits})",
             f"<code>{change.likely[:8]}</code>", f"<code>{(change.fixed_by or change.fixes or '')[:8]}</code>"]
    kinds = ["", ' class="what"', ' class="n"', "", ' class="n"', "", ""]
    return (f'<tr class="{change.kind.value} {_status(change)}">'
            + "".join(f"<td{kind}>{cell}</td>" for kind, cell in zip(kinds, cells)) + "</tr>")


def _summary(found: Sequence[Change], anchors: dict[tuple[str, str], str]) -> str:
    """One row per change (regressions, then improvements), each linking to its panel."""
    if not found:
        return "<p>No step in any benchmark.</p>"
    return ('<table class="summary"><thead><tr><th>benchmark</th><th>status</th><th>how much (99%)</th>'
            "<th>before → after</th><th>last good..first bad</th><th>likely</th><th>fixed by / fixes</th>"
            "</tr></thead><tbody>" + "".join(_row(c, anchors[c.name, c.params]) for c in found) + "</tbody></table>")


def render(history: History, changes: Changes, factor: float, title: str | None = None) -> str:
    """One self-contained HTML page: a header with a summary table, then one plot per benchmark combination
    with a step or a drift, its steps marked (the others are only named at the end).

    Args:
        history: from :func:`~harness.ci.tracking.history.load_history`.
        changes: :func:`~harness.ci.tracking.regressions.find_changes` over ``history``.
        factor: the factor ``changes`` was found with (shown in the header).
        title: the page's title; default ``Regressions and improvements of machine <machine>``.

    Returns:
        The page: inline CSS and SVG, no script, no external URL.
    """
    found = [*changes.regressions, *changes.improvements]
    by_key: dict[tuple[str, str], list[Change]] = {}
    for change in found:
        by_key.setdefault((change.name, change.params), []).append(change)
    drifts = {(d.name, d.params): d for d in changes.drifts}
    shown = [key for key in history.series if key in by_key or key in drifts]
    anchors = {key: f"series-{i + 1}" for i, key in enumerate(shown)}
    quiet = [_label(s) for key, s in history.series.items() if key not in anchors and key in changes.fits]
    title = title or f"Regressions and improvements of machine {history.machine}"
    body = [_header(history, changes, factor, title), _summary(found, anchors)]
    body += [_panel(history, history.series[key], changes.fits.get(key), by_key.get(key, []), drifts.get(key),
                    anchors[key]) for key in shown]
    if quiet:
        body.append(f'<p class="quiet">No step or drift in: {_e(", ".join(quiet))}.</p>')
    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<meta name="viewport" '
            f'content="width=device-width, initial-scale=1">\n<title>{_e(title)}</title>\n<style>{_CSS}</style>\n'
            "</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")
