"""``harness dashboard``: ``asv publish``, then the dashboard made self-contained, so that it renders offline.

asv publish writes a dashboard whose index.html loads its scripts and styles (jQuery, flot,
Bootstrap, ...) from CDNs: without the internet it shows only asv's error page. This command runs
``asv publish`` and then rewrites the pages to load copies shipped with harness, each with its own
integrity hash, from ``HTML_DIR/vendor/`` (``harness.ci.dashboard.make_offline``). It fails, naming
the URL, where asv's pages load something harness has no copy of. The nightly publish workflow
(.github/workflows/publish.yml) builds its dashboard with this command, so what it deploys is what
you get here.

Beside asv's pages it writes harness' own regressions page (harness.ci.tracking.page), one per machine
with results: HTML_DIR/harness-regressions.html (several machines: harness-regressions-MACHINE.html),
each benchmark that stepped drawn with its fitted levels and its steps marked (standing regressions,
fixed ones and the commit that fixed them, improvements), as ``harness regressions`` finds them. Commits
are ordered along the first-parent line of the config's first branch where its repo is a git checkout,
else by the dates asv recorded. asv's navigation bar gets a link to each page where its index.html has
the place for one (else a note says so). A history that cannot be read costs its page only, with a
warning: the dashboard is still written.

Exit status: 0 written, 2 on errors (asv publish failing, an external URL without a copy).

Examples:
    harness dashboard                                  # asv.conf.json's results into its html_dir
    harness dashboard --config asv.conf.json --html-dir site/
    python -m http.server -d .asv/html                 # then browse http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path
from urllib.parse import quote

from harness.errors import InvalidValue
from harness.extras import require

__all__ = ["add_parser", "run"]

_PAGE = "harness-regressions.html"  # harness' regressions page where the results have one machine


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("dashboard", help="asv publish, with the dashboard's scripts and styles shipped "
                                                "beside it (renders offline)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="asv.conf.json", help="asv config file (default %(default)s)")
    p.add_argument("--html-dir", metavar="DIR",
                   help="where the dashboard is written (default: the config's html_dir, relative to its folder)")
    p.add_argument("--no-pull", action="store_true", help="asv publish --no-pull: do not fetch the repository")
    p.set_defaults(run=run)


def run(args) -> int:
    from harness.ci.asvrun import AsvProject
    from harness.ci.dashboard import make_offline

    config = Path(args.config).resolve()
    if not config.is_file():
        raise InvalidValue(f"no asv config at {config}; run from the repository root or pass --config")
    require("asv", package="asv", extra="bench", purpose="harness dashboard")
    # asv reads the config's paths relative to the folder it runs in: the config's, as bench-compare runs it.
    html_dir = Path(args.html_dir).resolve() if args.html_dir else config.parent / _config_html_dir(config)
    argv = ["publish", "--html-dir", str(html_dir)] + (["--no-pull"] if args.no_pull else [])
    AsvProject(config, machine="").asv(argv)
    rewrites = make_offline(html_dir)
    print(f"harness dashboard: {html_dir}: {len(rewrites)} external script(s) and stylesheet(s) now load from "
          f"{html_dir / 'vendor'}; it renders offline", file=sys.stderr)
    pages = _regression_pages(config, _load_config(config), html_dir)
    _link_pages(html_dir, pages)
    return 0


def _load_config(config: Path) -> dict:
    from asv import util

    try:
        value = util.load_json(str(config), js_comments=True)
    except util.UserError as err:
        raise InvalidValue(f"cannot read the asv config {config}: {err}") from None
    return value if isinstance(value, dict) else {}


def _config_html_dir(config: Path) -> str:
    return str(_load_config(config).get("html_dir", "html"))


def _regression_pages(config: Path, settings: dict, html_dir: Path) -> dict[str, str]:
    """Writes harness' regressions page of each machine with results into ``html_dir``; returns
    ``{machine: page file name}`` of those written. A machine whose history cannot be read or drawn is
    left out, with a warning."""
    from harness.ci.tracking.resultsdir import machines

    results = config.parent / str(settings.get("results_dir", "results"))
    found = machines(results) if results.is_dir() else []
    if not found:
        print(f"harness dashboard: no machine with results in {results}: no harness regressions page",
              file=sys.stderr)
    checkout = _git_checkout(config, settings)
    written = {}
    for machine in found:
        name = _PAGE if len(found) == 1 else f"harness-regressions-{machine}.html"
        try:
            summary = _write_page(results, machine, checkout, html_dir / name)
        except Exception as err:  # noqa: BLE001  a history that cannot be read costs its page, not the dashboard
            print(f"harness dashboard: warning: no regressions page for machine {machine!r}: "
                  f"{type(err).__name__}: {err}", file=sys.stderr)
            continue
        written[machine] = name
        print(f"harness dashboard: {html_dir / name}: {summary}", file=sys.stderr)
    return written


def _git_checkout(config: Path, settings: dict) -> tuple[Path | None, str | None]:
    """The config's repo folder and first branch where it is a git checkout having that branch; else None."""
    from harness.ci import gitrepo

    repo = settings.get("repo")
    path = config.parent / str(repo) if isinstance(repo, str) and "://" not in repo else None
    if path is None or not path.is_dir() or gitrepo.find_commit(path, "HEAD") is None:
        return None, None
    branches = settings.get("branches") or []
    branch = str(branches[0]) if isinstance(branches, list) and branches else None
    return path, branch if branch and gitrepo.find_commit(path, branch) else None


def _write_page(results: Path, machine: str, checkout: tuple[Path | None, str | None], page: Path) -> str:
    """Reads the machine's history (ordered by the checkout where it holds the commits, else by dates), finds
    its changes, writes the page; returns a line saying what it shows."""
    from harness.ci.benchgate import FACTOR
    from harness.ci.tracking.history import CommitsNotInRepo, load_history
    from harness.ci.tracking.page import render
    from harness.ci.tracking.regressions import find_changes

    repo, branch = checkout
    try:
        history = load_history(results, machine, repo, branch)
    except CommitsNotInRepo as err:
        print(f"harness dashboard: {err}; ordering machine {machine!r} by commit dates", file=sys.stderr)
        history = load_history(results, machine, None)
    changes = find_changes(history, FACTOR)
    page.write_text(render(history, changes, FACTOR), encoding="utf-8")
    standing = len(changes.standing)
    return (f"{standing} standing regression(s), {len(changes.regressions) - standing} fixed, "
            f"{len(changes.improvements)} improvement(s) over {len(history.commits)} commits of machine {machine!r}")


_NAV_ITEM = re.compile(r'<li id="nav-li-regressions"[^>]*>.*?</li>', re.S)  # asv's "Regressions" tab


def _link_pages(html_dir: Path, pages: dict[str, str]) -> None:
    """Adds a link to each page to asv's navigation bar, after its Regressions tab; where index.html has no
    such tab (another asv version) or cannot be rewritten, leaves it be and says so."""
    if not pages:
        return
    index = html_dir / "index.html"
    why = f"{index} has no Regressions tab to put it beside"
    try:
        text = index.read_text(encoding="utf-8")
        found = _NAV_ITEM.search(text)
        if found is not None and 'id="nav-li-harness-regressions' not in text:
            links = "".join(_nav_item(name, None if name == _PAGE else machine) for machine, name in pages.items())
            index.write_text(text[:found.end()] + links + text[found.end():], encoding="utf-8")
    except OSError as err:
        found, why = None, f"cannot rewrite {index} ({err})"
    if found is None:
        print(f"harness dashboard: note: no link to {', '.join(pages.values())} in asv's navigation bar: {why}",
              file=sys.stderr)


def _nav_item(page: str, machine: str | None) -> str:
    """A tab of asv's navigation bar (as asv writes its own) that opens ``page``."""
    suffix, label = ("", "") if machine is None else (f"-{machine}", f" ({machine})")
    return (f'\n\t<li id="nav-li-harness-regressions{html.escape(suffix)}"><a href="{html.escape(quote(page))}">'
            f"harness regressions{html.escape(label)}</a></li>")
