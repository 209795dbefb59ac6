"""The offline asv dashboard (harness.ci.dashboard, harness dashboard): no browser, no network.

make_offline on a copy of installed asv's own www/ leaves no external script or stylesheet, each rewritten
one carries the integrity of the file it now loads, an external URL without a vendored copy fails naming it
(before any page is touched), and vendor.json matches the vendored files on disk. The browser test
(tests/ci/test_published_site_in_a_browser.py) loads the result in Chromium.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.ci.dashboard import (
    VENDOR_DIR,
    VENDORED,
    external_resources,
    load_vendor,
    make_offline,
    sri,
    vendor_problems,
    vendored_files,
)
from harness.errors import Failed, Unavailable

asv = pytest.importorskip("asv")
ROOT = Path(__file__).resolve().parents[2]
ASV_WWW = Path(asv.__file__).parent / "www"


class _Loads(HTMLParser):
    """(tag, url, integrity) of every script and stylesheet a page loads."""

    def __init__(self):
        super().__init__()
        self.found = []

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "script" and found.get("src"):
            self.found.append((tag, found["src"], found.get("integrity")))
        if tag == "link" and "stylesheet" in (found.get("rel") or "") and found.get("href"):
            self.found.append((tag, found["href"], found.get("integrity")))


def _loads(page: Path) -> list[tuple[str, str, str | None]]:
    parser = _Loads()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser.found


@pytest.fixture()
def www(tmp_path) -> Path:
    """A copy of asv's dashboard template, as asv publish copies it into html_dir."""
    shutil.copytree(ASV_WWW, tmp_path / "html")
    return tmp_path / "html"


def test_asv_index_loads_external_scripts_and_styles():
    assert len(external_resources((ASV_WWW / "index.html").read_text())) >= 10  # what this is all about


def test_make_offline_leaves_no_external_script_or_stylesheet(www):
    before = _loads(www / "index.html")
    rewrites = make_offline(www)
    after = _loads(www / "index.html")
    assert len(after) == len(before), "no script or stylesheet is added or dropped"
    assert [r.url for r in rewrites] == [url for _, url, _ in before if url.startswith("https://")]
    assert external_resources((www / "index.html").read_text()) == []
    assert not [url for _, url, _ in after if re.match(r"(https?:)?//", url)]
    for page in www.glob("*.html"):
        assert external_resources(page.read_text()) == [], page.name


def test_each_rewritten_tag_has_the_integrity_of_the_file_it_loads(www):
    make_offline(www)
    local = [(url, integrity) for _, url, integrity in _loads(www / "index.html") if url.startswith(VENDOR_DIR)]
    assert len(local) == 10
    for url, integrity in local:
        assert integrity and integrity.startswith("sha384-"), url
        assert sri((www / url).read_bytes()) == integrity, url
    text = (www / "index.html").read_text()
    assert 'onerror="js_load_failure()"' in text, "asv's own fallback to its error page is kept"


def test_the_rest_of_the_page_is_unchanged(www):
    original = (www / "index.html").read_text()
    make_offline(www)
    changed = (www / "index.html").read_text()
    strip = re.compile(r"<(script|link)\b[^>]*>")
    assert strip.sub("<tag>", changed) == strip.sub("<tag>", original)


def test_the_vendored_files_and_their_licenses_are_copied_beside_the_pages(www):
    make_offline(www)
    manifest = load_vendor()
    for package in manifest["packages"]:
        for text in package["license_files"]:
            assert (www / VENDOR_DIR / text).is_file()
    assert vendor_problems(www / VENDOR_DIR) == []
    # bootstrap.min.css loads its fonts relative to itself: they are where it looks
    css = next(f for f in vendored_files(manifest) if f.path.endswith("bootstrap.min.css"))
    fonts = re.findall(r"url\(['\"]?([^'\")?#]+)", (www / VENDOR_DIR / css.path).read_text())
    assert fonts
    for font in fonts:
        assert (www / VENDOR_DIR / Path(css.path).parent / font).resolve().is_file(), font


def test_running_it_twice_changes_nothing(www):
    make_offline(www)
    once = (www / "index.html").read_text()
    assert make_offline(www) == []
    assert (www / "index.html").read_text() == once


def test_an_external_url_without_a_vendored_copy_fails_naming_it(www):
    page = www / "index.html"
    text = page.read_text()
    url = "https://cdn.example.invalid/newlib/1.0/newlib.min.js"
    page.write_text(text.replace("</head>", f'<script src="{url}"></script>\n</head>'))
    with pytest.raises(Unavailable) as raised:
        make_offline(www)
    message = str(raised.value)
    assert url in message and "index.html" in message and "\n" not in message
    assert "code.jquery.com" in page.read_text(), "nothing is rewritten when one URL has no copy"
    assert not (www / VENDOR_DIR).exists()


@pytest.mark.parametrize("tag", [
    '<link rel="stylesheet" href="//cdn.example.invalid/x.css">',
    '<img src="http://cdn.example.invalid/logo.png">',
    '<link rel="icon" href="https://cdn.example.invalid/favicon.ico"/>',
], ids=["protocol-relative-css", "image", "icon"])
def test_other_external_loads_fail_too(www, tag):
    page = www / "error.html"
    page.write_text(page.read_text().replace("</head>", tag + "\n</head>"))
    with pytest.raises(Unavailable, match="error.html loads .*cdn.example.invalid"):
        make_offline(www)


def test_links_that_load_nothing_are_left_alone(www):
    page = www / "error.html"
    extra = ('<link rel="alternate" href="https://example.invalid/feed.xml">'
             '<a href="https://github.com/airspeed-velocity/asv/">asv</a>')
    page.write_text(page.read_text().replace("</head>", extra + "\n</head>"))
    make_offline(www)
    assert extra in page.read_text()


def test_a_damaged_vendored_file_fails(tmp_path, www):
    vendored = tmp_path / "vendored"
    shutil.copytree(VENDORED, vendored, ignore=shutil.ignore_patterns("__pycache__"))
    target = vendored / vendored_files(load_vendor(vendored))[0].path
    target.write_bytes(target.read_bytes() + b"\n// changed")
    with pytest.raises(Failed, match="do not match their vendor.json"):
        make_offline(www, vendored)


def test_vendor_json_matches_the_files_on_disk():
    assert vendor_problems() == []
    manifest = load_vendor()
    names = {p["name"] for p in manifest["packages"]}
    assert {"jquery", "flot", "flot-orderbars", "stupid-table-plugin", "blueimp-md5", "bootstrap"} <= names
    for package in manifest["packages"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", package["version"]), package
        assert package["integrity"].startswith("sha512-") and package["license"] == "MIT", package
        assert package["tarball"] == (f"https://registry.npmjs.org/{package['name']}/-/{package['name']}-"
                                      f"{package['version']}.tgz")


def test_vendor_problems_reports_a_missing_an_unlisted_and_a_changed_file(tmp_path):
    vendored = tmp_path / "vendored"
    shutil.copytree(VENDORED, vendored, ignore=shutil.ignore_patterns("__pycache__"))
    first, second = vendored_files(load_vendor(vendored))[:2]
    (vendored / first.path).unlink()
    (vendored / second.path).write_text("changed")
    (vendored / "stray.js").write_text("")
    problems = vendor_problems(vendored)
    assert any(first.path in p and "missing" in p for p in problems)
    assert any(second.path in p and "hash" in p for p in problems)
    assert any("stray.js" in p and "not listed" in p for p in problems)


def test_every_url_of_the_pinned_asv_has_a_vendored_copy_and_the_same_bytes_where_the_package_has_them():
    urls = {url for _, url in external_resources((ASV_WWW / "index.html").read_text())}
    files = vendored_files(load_vendor())
    assert urls == {url for f in files for url in f.urls}
    entries = {e["path"]: e for p in load_vendor()["packages"] for e in p["files"]}
    # The CDN's own files where npm ships them: vendor-dashboard compared them with asv's SRI hashes.
    same = {path for path, e in entries.items() if e.get("same_as_cdn")}
    assert {"jquery-3.3.1/jquery.min.js", "bootstrap-3.1.1/css/bootstrap.min.css",
            "bootstrap-3.1.1/js/bootstrap.min.js"} <= same


def test_the_wheel_ships_the_vendored_files():
    config = (ROOT / "pyproject.toml").read_text()
    assert '"dashboard/**/*"' in config and '"dashboard/*.json"' in config


def test_harness_dashboard_needs_an_asv_config(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness", "dashboard", "--config", str(tmp_path / "none.json")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no asv config" in done.stderr, done.stderr


def test_harness_dashboard_publishes_a_self_contained_dashboard(tmp_path):
    """asv publish over an empty history of a one-commit repository, then make_offline: no CDN URL left."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit",
                    "-q", "--allow-empty", "-m", "one"], check=True)
    (tmp_path / "results").mkdir()
    from asv.util import write_json

    write_json(str(tmp_path / "results" / "benchmarks.json"), {}, api_version=2)  # no benchmarks yet
    config = tmp_path / "asv.conf.json"
    config.write_text(json.dumps({"version": 1, "project": "demo", "repo": str(repo), "branches": ["main"],
                                  "results_dir": "results", "html_dir": "html"}))
    done = subprocess.run([sys.executable, "-m", "harness", "dashboard", "--config", str(config), "--no-pull"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    html = tmp_path / "html"
    assert external_resources((html / "index.html").read_text()) == []
    assert vendor_problems(html / VENDOR_DIR) == []
    assert "renders offline" in done.stderr
