"""harness' regressions page (harness.ci.tracking.page) and ``harness dashboard`` writing it: no browser, no network.

The history is real: a git repository of 60 commits and asv result files for them (tests/ci/asv_history.py):
``time_step`` 12% slower from commit 20 and back from commit 40 (a fixed regression and its fix, an
improvement), one failed night; samples/s 15% lower from commit 35 on (a standing regression), one skipped
night; a flat benchmark with two parameter combinations (no panel). The page is parsed, its SVG as XML, and
each mark checked against what find_changes found and against the commits planted.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("asv")

from harness.ci.dashboard import external_resources  # noqa: E402
from harness.ci.tracking.changepoints import Drift  # noqa: E402
from harness.ci.tracking.history import load_history  # noqa: E402
from harness.ci.tracking.page import COLORS, format_value, render  # noqa: E402
from harness.ci.tracking.regressions import Changes, SeriesDrift, Status, find_changes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
import asv_history as ah  # noqa: E402

N, SLOWER, BACK, DROP, FAILED, SKIPPED = 60, 20, 40, 35, 10, 50
TIME = ah.benchmark("throughput.Fit.time_step")
RATE = ah.benchmark("throughput.Fit.track_samples_per_second", unit="samples/s")
FLAT = ah.benchmark("throughput.Split.time_epoch", params=[["'even'", "'ratio'"]], param_names=["method"])
RED, ORANGE, GREEN = COLORS["standing"], COLORS["fixed"], COLORS["improvement"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``(folder, commits, history, changes, page)``: the folder holds ``repo`` and ``results``."""
    tmp = tmp_path_factory.mktemp("page")
    commits = ah.make_repo(tmp / "repo", N)
    time = [v * (1.12 if SLOWER <= i < BACK else 1.0) for i, v in enumerate(ah.levels(N, 0.01, 0, base=0.004))]
    rate: list = ah.levels(N, 0.01, 1000, DROP, -0.15, base=2400.0)
    time[FAILED], rate[SKIPPED] = None, float("nan")
    flat = zip(ah.levels(N, 0.01, 7, base=0.5), ah.levels(N, 0.01, 8, base=0.6))
    ah.write_history(tmp / "results", commits, [TIME, RATE, FLAT], {
        TIME["name"]: [[v] for v in time], RATE["name"]: [[v] for v in rate], FLAT["name"]: [list(p) for p in flat]})
    history = load_history(tmp / "results", repo=tmp / "repo")
    changes = find_changes(history, 1.03)
    return tmp, commits, history, changes, render(history, changes, 1.03)


def _panels(page: str) -> dict[str, ET.Element]:
    """Each panel's plot, parsed as XML, by its benchmark's name."""
    found = {}
    for section in re.findall(r'<section class="panel".*?</section>', page, re.S):
        name = re.search(r'data-benchmark="([^"]*)"', section)
        svg = re.search(r'<svg class="plot".*?</svg>', section, re.S)
        assert name and svg, section[:300]
        found[html.unescape(name.group(1))] = ET.fromstring(svg.group(0))
    return found


def _classes(element: ET.Element) -> set[str]:
    return set(element.get("class", "").split())


def _steps(svg: ET.Element, *classes: str) -> list[ET.Element]:
    return [g for g in svg.iter("g") if {"step", *classes} <= _classes(g)]


def _x_of(svg: ET.Element, commit: str) -> float:
    """The x of the point drawn for ``commit`` (each point's tooltip starts with its short hash)."""
    return next(float(c.get("cx", "nan")) for c in svg.iter("circle")
                if (c.findtext("title") or "").startswith(commit[:8]))


def test_the_detector_finds_what_was_planted(made):
    """The premise of the checks below: one fixed and one standing regression, the fix an improvement."""
    _, commits, _, changes, _ = made
    assert [(r.name, r.status) for r in changes.regressions] == [(TIME["name"], Status.FIXED),
                                                                 (RATE["name"], Status.STANDING)]
    assert [i.name for i in changes.improvements] == [TIME["name"]]
    slower, drop = changes.regressions
    assert commits.index(slower.last_good) < SLOWER <= commits.index(slower.first_bad)
    assert commits.index(drop.last_good) < DROP <= commits.index(drop.first_bad)
    assert commits.index(slower.fixed_by) == BACK


def test_every_svg_is_well_formed_xml(made):
    page = made[4]
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) >= 2
    for svg in svgs:
        ET.fromstring(svg)


def test_a_panel_for_each_stepped_series_none_for_the_flat_one(made):
    page = made[4]
    assert set(_panels(page)) == {TIME["name"], RATE["name"]}
    quiet = re.search(r'<p class="quiet">(.*?)</p>', page, re.S).group(1)
    assert html.unescape(quiet).count(FLAT["name"]) == 2  # named, once per parameter combination


def test_the_standing_regression_is_a_red_band_at_its_commits_and_a_line_at_its_likely_commit(made):
    _, _, _, changes, page = made
    drop = changes.regressions[1]
    svg = _panels(page)[RATE["name"]]
    (step,) = _steps(svg, "regression")
    assert _classes(step) == {"step", "regression", "standing"} and step.get("data-status") == "standing"
    assert (step.get("data-last-good"), step.get("data-first-bad"), step.get("data-likely")) == (
        drop.last_good, drop.first_bad, drop.likely)
    band, line = step.find("rect"), step.find("line")
    assert band.get("fill") == RED and line.get("stroke") == RED
    left, right = float(band.get("x")), float(band.get("x")) + float(band.get("width"))
    assert left == pytest.approx(_x_of(svg, drop.last_good)) and right == pytest.approx(_x_of(svg, drop.first_bad))
    assert float(line.get("x1")) == pytest.approx(_x_of(svg, drop.likely))
    assert not [e for e in svg.iter() if "fix" in _classes(e)]


def test_the_fixed_regression_is_an_orange_band_with_its_fix_line_and_the_fix_a_green_one(made):
    _, _, _, changes, page = made
    slower, fix = changes.regressions[0], changes.improvements[0]
    svg = _panels(page)[TIME["name"]]
    (step,) = _steps(svg, "regression")
    assert _classes(step) == {"step", "regression", "fixed"} and step.get("data-first-bad") == slower.first_bad
    assert step.find("rect").get("fill") == ORANGE
    (line,) = [e for e in step.iter("line") if "fix" in _classes(e)]
    assert (line.get("data-fixed-by"), line.get("data-fixes")) == (slower.fixed_by, slower.first_bad)
    assert float(line.get("x1")) == pytest.approx(_x_of(svg, slower.fixed_by))
    (better,) = _steps(svg, "improvement")
    assert better.get("data-first-bad") == fix.first_bad and better.find("rect").get("fill") == GREEN
    assert fix.fixes == slower.first_bad


def test_the_marks_follow_the_status_not_the_order(made):
    """Render with the two regressions' statuses swapped (nothing else): the marks swap with them (a page that
    ignored the status, coloring by position, kind or ``fixed_by`` alone, would not)."""
    _, _, history, changes, _ = made
    slower, drop = changes.regressions
    swapped = Changes((dataclasses.replace(slower, status=Status.STANDING),
                       dataclasses.replace(drop, status=Status.FIXED)),
                      changes.improvements, changes.drifts, changes.fits)
    panels = _panels(render(history, swapped, 1.03))
    (time_step,) = _steps(panels[TIME["name"]], "regression")
    (rate_step,) = _steps(panels[RATE["name"]], "regression")
    assert "standing" in _classes(time_step) and time_step.find("rect").get("fill") == RED
    assert "fixed" in _classes(rate_step) and rate_step.find("rect").get("fill") == ORANGE


def test_the_fitted_levels_the_failed_night_and_the_skipped_one(made):
    _, commits, _, changes, page = made
    panels = _panels(page)
    time_levels = [float(e.get("y1")) for e in panels[TIME["name"]].iter("line") if "level" in _classes(e)]
    assert len(time_levels) == 3 and time_levels[1] < min(time_levels[0], time_levels[2])  # higher: drawn above
    (cross,) = [e for e in panels[TIME["name"]].iter("path") if "failed" in _classes(e)]
    assert cross.get("data-commit") == commits[FAILED]
    points = [c.find("title").text[:8] for c in panels[RATE["name"]].iter("circle")]
    assert len(points) == N - 1 and commits[SKIPPED][:8] not in points


def test_a_drift_alone_gets_a_panel_without_step_marks(made):
    _, _, history, changes, _ = made
    drift = SeriesDrift(FLAT["name"], "'ratio'", Drift(0.002, 0.125, 5.0), N)
    page = render(history, dataclasses.replace(changes, drifts=(drift,)), 1.03)
    sections = re.findall(r'<section class="panel".*?</section>', page, re.S)
    (flat,) = [s for s in sections if FLAT["name"] in s]
    assert "slow drift</span>: 12.5% worse over 60 commits" in flat and 'class="step' not in flat
    assert ">1</b> drift<" in page and "time_epoch(&#x27;even&#x27;)." in page  # the other one, only named


def test_the_axes_carry_values_in_the_benchmarks_unit_and_short_hashes(made):
    _, commits, _, _, page = made
    panels = _panels(page)
    ticks = [t.text for t in panels[TIME["name"]].iter("text") if "ytick" in _classes(t)]
    assert len(ticks) >= 3 and all(t.endswith(" ms") for t in ticks), ticks
    hashes = [t.text for t in panels[RATE["name"]].iter("text") if "xtick" in _classes(t)]
    assert 3 <= len(hashes) <= 6 and hashes[0] == commits[0][:8] and hashes[-1] == commits[-1][:8]


def test_the_header_counts_and_the_summary_links_each_change_to_its_panel(made):
    _, _, _, changes, page = made
    counts = html.unescape(re.sub(r"<[^>]+>", "", re.search(r'<p class="counts">.*?</p>', page).group(0)))
    assert counts == "1 standing regression, 1 fixed regression, 1 improvement, 0 drifts"
    rows = re.findall(r'<tr class="([^"]+)"><td><a href="#([^"]+)">', page)
    assert [r[0] for r in rows] == ["regression fixed", "regression standing", "improvement improvement"]
    ids = dict(re.findall(r'<section class="panel" id="([^"]+)" data-benchmark="([^"]+)"', page))
    assert [ids[anchor] for _, anchor in rows] == [TIME["name"], RATE["name"], TIME["name"]]
    assert "1.12x worse (" in page and "1.1" in html.unescape(page)


def test_the_page_loads_nothing_and_escapes_its_text(made):
    _, _, history, changes, page = made
    assert external_resources(page) == []
    assert not re.search(r"https?:|<script|<link|<img|\burl\(|@import", page, re.I)
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', page))
    titled = render(history, changes, 1.03, title="<script>alert('x')</script> & co")
    assert "<script>" not in titled and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in titled
    assert "time_epoch(&#x27;even&#x27;)" in page  # parameters are quoted in asv's names


@pytest.mark.parametrize("value, unit, text", [
    (0.004123, "seconds", "4.123 ms"), (2.5e-7, "seconds", "250 ns"), (12.0, "seconds", "12 s"),
    (3.2e-5, "seconds", "32 μs"), (1536.0, "bytes", "1.536 kB"), (2.1e9, "bytes", "2.1 GB"),
    (2400.0, "samples/s", "2.4k samples/s"), (0.93, "unit", "0.93"), (0.0, "seconds", "0 s"),
    (None, "seconds", "failed"), (float("nan"), "bytes", "skipped")])
def test_format_value(value, unit, text):
    assert format_value(value, unit) == text


def _config(folder: Path, results: Path, repo: Path) -> Path:
    config = folder / "asv.conf.json"
    config.write_text(json.dumps({"version": 1, "project": "demo", "project_url": "#", "repo": str(repo),
                                  "dvcs": "git", "branches": ["main"], "results_dir": str(results),
                                  "html_dir": "html"}))
    return config


def test_harness_dashboard_writes_a_page_per_machine_and_links_it_a_broken_history_costs_only_its_page(made,
                                                                                                        tmp_path):
    folder = made[0]
    results = tmp_path / "results"
    shutil.copytree(folder / "results", results)
    (results / "empty").mkdir()
    (results / "empty" / "machine.json").write_text('{"machine": "empty", "version": 1}')  # no results at all
    config = _config(tmp_path, results, folder / "repo")
    done = subprocess.run([sys.executable, "-m", "harness", "dashboard", "--config", str(config), "--no-pull"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning: no regressions page for machine 'empty'" in done.stderr, done.stderr
    page = (tmp_path / "html" / "harness-regressions-ci.html").read_text()
    assert len(_panels(page)) == 2 and "git rev-list --first-parent main" in page
    assert not (tmp_path / "html" / "harness-regressions-empty.html").exists()
    index = (tmp_path / "html" / "index.html").read_text()
    assert index.count('<a href="harness-regressions-ci.html">harness regressions (ci)</a>') == 1
    assert external_resources(index) == []


def test_the_link_is_left_out_with_a_note_where_asvs_page_has_no_regressions_tab(tmp_path, capsys):
    from harness.cli.dashboard import _link_pages

    (tmp_path / "index.html").write_text("<nav><ul><li>other</li></ul></nav>")
    _link_pages(tmp_path, {"ci": "harness-regressions.html"})
    assert (tmp_path / "index.html").read_text() == "<nav><ul><li>other</li></ul></nav>"
    assert "no link to harness-regressions.html" in capsys.readouterr().err
    (tmp_path / "index.html").write_text('<ul>\n<li id="nav-li-regressions"><a href="#/regressions">R</a></li>\n</ul>')
    for _ in range(2):  # a second run adds nothing
        _link_pages(tmp_path, {"ci": "harness-regressions.html"})
    text = (tmp_path / "index.html").read_text()
    assert text.count('<a href="harness-regressions.html">harness regressions</a>') == 1
    assert text.index("nav-li-regressions") < text.index("nav-li-harness-regressions") < text.index("</ul>")
