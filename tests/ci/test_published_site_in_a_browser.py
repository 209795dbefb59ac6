"""The published site in a real browser, offline: the docs and the asv dashboard render with nothing from outside.

As .github/workflows/publish.yml lays out GitHub Pages: the dashboard (``harness dashboard`` over a small real
asv results history, tests/ci/asv_history.py) at the root, the docs (``mkdocs build --strict``) under /docs/.
Both are served from 127.0.0.1 and loaded in headless Chromium (Playwright driving the system's browser, no
download) with every request to another host blocked, so anything the pages fetch from the internet fails the
test. Checked as a person would: the docs' home and a second page show their title, nav and search box, and a
search finds pages; the dashboard's grid and its benchmark list show the benchmarks (the list sorts), the
regressions page fills, and a benchmark's page draws a graph with its series; harness' own regressions page,
opened from the link in asv's navigation bar, draws each stepped benchmark with its steps marked. No console
error, no failed or blocked request. The guard: the same check on plain ``asv publish`` output fails (its CDN
scripts are blocked and asv shows its error page), so the check can fail.

Screenshots go to ``$HARNESS_ARTIFACTS`` (default: a temporary folder; the path is printed). Marked ``browser``:
run with ``--run-browser`` where Chromium is installed (.ci/run installs Debian's chromium and runs them).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.pytest_plugin import NO_CHROMIUM, chromium_path

pytestmark = pytest.mark.browser

pytest.importorskip("asv")
from asv_history import benchmark, levels, make_repo, write_history  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "ci"
SAMPLES = "throughput.Throughput.track_samples_per_second"
STEP = "throughput.TrainStep.time_train_step"
TIMEOUT_MS = 20_000
NIGHTS = 20  # enough for two steps: a level holds at least 6 nights (harness.ci.tracking.changepoints.MIN_RUN)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("HARNESS_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"browser test screenshots: {folder}")
    return folder


def _asv_project(tmp: Path) -> Path:
    """An asv config over a git repository of 40 commits and the results of 20 of them (two benchmarks): samples/s
    of one combination 20% lower from night 10 on (a standing regression), the train step 15% slower over nights
    6-12 (a fixed regression, and its fix), the other combination flat."""
    commits = make_repo(tmp / "repo", 2 * NIGHTS)
    nights = commits[::2]
    samples = benchmark(SAMPLES, "samples/s", [["'mnist_maxing'"], ["'even'", "'ratio'"]], ["workload", "split"])
    step = benchmark(STEP, "seconds")
    slower = [v * (1.15 if 6 <= i < 13 else 1) for i, v in enumerate(levels(NIGHTS, 0.02, seed=6, base=0.004))]
    series = {SAMPLES: [[a, b] for a, b in zip(levels(NIGHTS, 0.02, seed=5, base=2400),
                                               levels(NIGHTS, 0.02, seed=7, step_at=10, step=-0.2, base=2800))],
              STEP: [[v] for v in slower]}
    write_history(tmp / "results", nights, [samples, step], series, machine=MACHINE)
    config = tmp / "asv.conf.json"
    config.write_text(f'{{"version": 1, "project": "demo", "project_url": "#", "repo": "{tmp / "repo"}", '
                      f'"dvcs": "git", "branches": ["main"], "results_dir": "results", "html_dir": "html"}}\n')
    return config


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> tuple[Path, Path]:
    """``(pages, raw)``: the Pages layout (harness dashboard at the root, the docs under docs/), and the plain
    ``asv publish`` output of the same history."""
    tmp = tmp_path_factory.mktemp("sites")
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: the docs extra (scripts/dev-env.sh installs it)", pytrace=False)
    env_docs = dict(os.environ, NO_MKDOCS_2_WARNING="1", NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp / "docs")],
                          cwd=ROOT, env=env_docs, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    config = _asv_project(tmp / "asv")
    _run([sys.executable, "-m", "harness", "dashboard", "--config", str(config), "--no-pull"], tmp)
    _run([sys.executable, "-m", "asv", "publish", "--config", str(config), "--no-pull", "--html-dir",
          str(tmp / "raw")], config.parent)
    pages = tmp / "pages"
    shutil.copytree(config.parent / "html", pages)
    shutil.copytree(tmp / "docs", pages / "docs")
    return pages, tmp / "raw"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class' name)
        pass


@contextmanager
def serve(folder: Path):
    """``folder`` over HTTP on 127.0.0.1 (a free port); yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Watch:
    """What the page did wrong: console errors, uncaught exceptions, failed requests, blocked requests."""

    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return ([f"console: {e}" for e in self.errors] + [f"request failed: {f}" for f in self.failed]
                + [f"blocked (not 127.0.0.1): {b}" for b in self.blocked])


@pytest.fixture(scope="module")
def browser():
    executable = chromium_path()
    if executable is None:  # the plugin skips browser tests first; kept for a direct run
        pytest.skip(NO_CHROMIUM)
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed (pip install the browser extra)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


@contextmanager
def offline_page(browser):
    """A page of a fresh context in which every request to a host other than 127.0.0.1 is aborted (and noted)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    watch = Watch()

    def route(route):
        host = urlsplit(route.request.url).hostname
        if route.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            route.continue_()
        else:
            watch.blocked.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda msg: watch.errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: watch.errors.append(f"uncaught: {exc}"))
    page.on("requestfailed", lambda req: watch.failed.append(f"{req.url} ({req.failure})"))
    page.on("response", lambda resp: watch.failed.append(f"{resp.url} (HTTP {resp.status})")
            if resp.status >= 400 else None)
    try:
        yield page, watch
    finally:
        context.close()


def check_dashboard(page, base: str, shots: Path | None, timeout_ms: int = TIMEOUT_MS) -> list[str]:
    """Loads the dashboard's grid, then one benchmark's graph; what a person would find wrong."""
    problems = []
    page.goto(f"{base}/index.html", wait_until="load")
    try:
        page.wait_for_selector("#summarygrid-display .benchmark-container", state="visible", timeout=timeout_ms)
    except Exception as err:  # noqa: BLE001  playwright's TimeoutError: the grid did not appear
        if shots:
            page.screenshot(path=str(shots / "dashboard-index.png"), full_page=True)
        return [f"the benchmark grid did not appear ({type(err).__name__}); the page is {page.url!r}, titled "
                f"{page.title()!r}"]
    names = page.locator("#summarygrid-display .benchmark-text").all_inner_texts()
    missing = [name for name in (SAMPLES, STEP) if not any(name.split(".", 1)[1] in text for text in names)]
    if missing:
        problems.append(f"the grid lacks {missing}; it shows {names}")
    if shots:
        page.screenshot(path=str(shots / "dashboard-index.png"), full_page=True)
    # The benchmark list (a table stupidtable sorts) and the regressions page (stupidtable, blueimp-md5).
    page.goto(f"{base}/index.html#/summarylist", wait_until="load")
    page.wait_for_selector("#summarylist-body table tbody tr", state="visible", timeout=timeout_ms)
    rows = page.locator("#summarylist-body table tbody tr").all_inner_texts()
    if not all(any(name.rsplit(".", 1)[1] in row for row in rows) for name in (SAMPLES, STEP)):
        problems.append(f"the benchmark list lacks a benchmark: {rows}")
    page.locator("#summarylist-body table thead th").first.click()  # sort by name, as a person might
    page.wait_for_timeout(300)
    if page.locator("#summarylist-body table tbody tr").all_inner_texts() == rows:
        problems.append("clicking the list's Benchmark column did not sort it (stupidtable)")
    if shots:
        page.screenshot(path=str(shots / "dashboard-list.png"), full_page=True)
    page.goto(f"{base}/index.html#/regressions", wait_until="load")
    page.wait_for_function("() => document.querySelector('#regressions-body').innerText.trim().length > 0",
                           timeout=timeout_ms)
    page.goto(f"{base}/index.html#{SAMPLES}", wait_until="load")
    page.wait_for_selector("#main-graph canvas.flot-base", state="visible", timeout=timeout_ms)
    page.wait_for_function("() => { const p = window.jQuery && jQuery('#main-graph').data('plot');"
                           " return p && p.getData().length > 0; }", timeout=timeout_ms)
    drawn = page.evaluate("""() => {
        const series = jQuery('#main-graph').data('plot').getData();
        const points = series.map(s => s.data.filter(d => d[1] !== null).length);
        const canvas = document.querySelector('#main-graph canvas.flot-base');
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let inked = 0;
        for (let i = 3; i < pixels.length; i += 4) { if (pixels[i] > 0) inked++; }
        return {points, inked, width: canvas.width, height: canvas.height};
    }""")
    if len(drawn["points"]) < 2 or min(drawn["points"]) < 6:
        problems.append(f"the graph's series are not drawn: points per series {drawn['points']}")
    if drawn["inked"] < 2000:
        problems.append(f"the graph's canvas is nearly blank: {drawn['inked']} inked pixels")
    if shots:
        page.screenshot(path=str(shots / "dashboard-graph.png"), full_page=True)
    return problems


def test_the_docs_render_offline_with_nav_and_search(browser, sites, artifacts):
    pages, _ = sites
    with serve(pages) as base, offline_page(browser) as (page, watch):
        page.goto(f"{base}/docs/", wait_until="load")
        assert "harness" in page.title()
        assert page.locator("nav.md-nav--primary a.md-nav__link").count() >= 20, "the nav lists the pages"
        assert page.locator("article h1").first.is_visible()
        search = page.locator("input.md-search__input")
        assert search.count() == 1
        page.screenshot(path=str(artifacts / "docs-home.png"), full_page=False)
        search.click()
        page.wait_for_function("() => document.querySelector('.md-search-result__meta').textContent"
                               ".includes('Type to start')", timeout=TIMEOUT_MS)  # the index is loaded
        search.press_sequentially("bisect", delay=50)  # keystrokes, as a person types
        page.wait_for_selector(".md-search-result__item", state="visible", timeout=TIMEOUT_MS)
        assert page.locator(".md-search-result__item").count() >= 1
        page.screenshot(path=str(artifacts / "docs-search.png"), full_page=False)
        page.goto(f"{base}/docs/commands/benchmarks-and-gate/", wait_until="load")
        heading = (ROOT / "docs" / "commands" / "benchmarks-and-gate.md").read_text().splitlines()[0].lstrip("# ")
        assert page.locator("article h1").first.inner_text().strip().rstrip("¶") == heading
        assert page.locator("nav.md-nav--primary .md-nav__link--active").count() >= 1
        assert page.locator("input.md-search__input").is_visible()
        page.screenshot(path=str(artifacts / "docs-benchmarks-and-gate.png"), full_page=False)
        assert watch.problems() == []


def test_the_dashboard_renders_offline_with_the_benchmarks_and_a_graph(browser, sites, artifacts):
    pages, _ = sites
    with serve(pages) as base, offline_page(browser) as (page, watch):
        assert check_dashboard(page, base, artifacts) == []
        assert watch.problems() == []
    assert (artifacts / "dashboard-graph.png").stat().st_size > 10_000


def test_plain_asv_publish_output_fails_the_same_check(browser, sites, artifacts):
    """The guard: without harness dashboard's vendored copies, the CDN requests are blocked and asv gives up."""
    _, raw = sites
    with serve(raw) as base, offline_page(browser) as (page, watch):
        problems = check_dashboard(page, base, None, timeout_ms=5_000)
        page.screenshot(path=str(artifacts / "dashboard-without-vendoring.png"), full_page=False)
        assert problems and "did not appear" in problems[0], problems
        assert page.url.endswith("/error.html"), page.url  # asv's "external dependencies failed to load" page
        assert any(url.startswith("https://code.jquery.com/") for url in watch.blocked), watch.problems()


def test_the_harness_regressions_page_draws_the_steps_offline(browser, sites, artifacts):
    """Opened from asv's navigation bar as a person would: one plot per stepped benchmark, its points, levels and
    marks laid out (a standing regression, a fixed one with its fix, the improvement), nothing loaded from
    outside."""
    pages, _ = sites
    with serve(pages) as base, offline_page(browser) as (page, watch):
        page.goto(f"{base}/index.html", wait_until="load")
        link = page.locator("#nav-li-harness-regressions a")
        link.wait_for(state="visible", timeout=TIMEOUT_MS)
        link.click()
        page.wait_for_url("**/harness-regressions.html", timeout=TIMEOUT_MS)
        plots = page.locator("section.panel svg.plot")
        assert plots.count() == 2, page.locator("section.panel h2").all_inner_texts()
        for i in range(plots.count()):
            box = plots.nth(i).bounding_box()
            assert box and box["width"] > 800 and box["height"] > 150, box
        for marks, count in (("g.step.regression.standing", 1), ("g.step.regression.fixed", 1),
                             ("g.step.improvement", 1)):
            assert page.locator(marks).count() == count, marks
            assert page.locator(marks).first.is_visible(), marks
        band = page.locator("g.step.regression.standing rect.band").bounding_box()
        assert band and band["width"] >= 2 and band["height"] > 100, band
        fix = page.locator("g.step.regression.fixed line.fix").bounding_box()  # a vertical line: no width
        assert fix and fix["height"] > 100, fix
        levels = [page.locator("svg.plot line.level").nth(i).bounding_box() for i in range(5)]
        assert page.locator("svg.plot line.level").count() == 5 and all(b and b["width"] > 50 for b in levels)
        points = page.evaluate("() => [...document.querySelectorAll('svg.plot circle.value')]"
                               ".filter(c => c.getBoundingClientRect().width > 0).length")
        assert points == 2 * NIGHTS, points
        summary = page.locator("table.summary tbody tr").all_inner_texts()
        assert len(summary) == 3 and "standing regression" in summary[1], summary
        page.screenshot(path=str(artifacts / "harness-regressions.png"), full_page=True)
        assert watch.problems() == []
    assert (artifacts / "harness-regressions.png").stat().st_size > 10_000
