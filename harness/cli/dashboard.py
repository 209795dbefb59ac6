"""``harness dashboard``: ``asv publish``, then the dashboard made self-contained, so that it renders offline.

asv publish writes a dashboard whose index.html loads its scripts and styles (jQuery, flot,
Bootstrap, ...) from CDNs: without the internet it shows only asv's error page. This command runs
``asv publish`` and then rewrites the pages to load copies shipped with harness, each with its own
integrity hash, from ``HTML_DIR/vendor/`` (``harness.ci.dashboard.make_offline``). It fails, naming
the URL, where asv's pages load something harness has no copy of. The nightly publish workflow
(.github/workflows/publish.yml) builds its dashboard with this command, so what it deploys is what
you get here.

Exit status: 0 written, 2 on errors (asv publish failing, an external URL without a copy).

Examples:
    harness dashboard                                  # asv.conf.json's results into its html_dir
    harness dashboard --config asv.conf.json --html-dir site/
    python -m http.server -d .asv/html                 # then browse http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import InvalidValue
from harness.extras import require

__all__ = ["add_parser", "run"]


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
    return 0


def _config_html_dir(config: Path) -> str:
    from asv import util

    try:
        value = util.load_json(str(config), js_comments=True).get("html_dir", "html")
    except util.UserError as err:
        raise InvalidValue(f"cannot read the asv config {config}: {err}") from None
    return str(value)
