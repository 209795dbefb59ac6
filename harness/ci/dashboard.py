"""An asv dashboard that renders offline: asv publish's pages with their scripts and styles beside them.

asv publish's ``index.html`` loads jQuery, flot and its plugins, stupidtable, blueimp-md5 and
Bootstrap from CDNs (with SRI ``integrity`` attributes); without the internet, or where a CDN is
blocked, it shows only asv's error page. ``make_offline(html_dir)`` rewrites every page of a
published dashboard so that each external script and stylesheet points at a copy in
``html_dir/vendor/``, with the copy's own ``integrity`` attribute, and copies the vendored files
there. It fails, naming the URL, on an external script, stylesheet, image or frame it has no copy
of, so that an asv upgrade adding a dependency is caught when the dashboard is built rather than
when someone opens it.

The copies are package data (``harness/ci/dashboard/``), vendored by ``scripts/vendor-dashboard``
from the npm registry's packages at pinned versions, each tarball checked against the registry's
``dist.integrity``; ``harness/ci/dashboard/vendor.json`` records per package its version, tarball
integrity and license (the license texts lie beside the files), and per file its path, its
sha384 SRI value and the CDN URLs it stands in for. ``vendor_problems()`` holds the files on disk
to that record.

``harness dashboard`` (harness/cli/dashboard.py) runs ``asv publish`` and then this. Standard
library only.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from harness.errors import Failed, InvalidValue, Unavailable

__all__ = ["VENDORED", "VENDOR_DIR", "VendoredFile", "Rewrite", "sri", "load_vendor", "vendored_files",
           "vendor_problems", "external_resources", "make_offline"]

VENDORED = Path(__file__).with_name("dashboard")  # the vendored files and vendor.json (package data)
VENDOR_DIR = "vendor"  # where make_offline copies them, under the dashboard's html_dir
# <link rel=...> values that load what they point at (alternate, canonical, ... only name a page).
_LOADING_RELS = {"stylesheet", "icon", "apple-touch-icon", "mask-icon", "preload", "modulepreload", "prefetch",
                 "manifest"}
_SRC_TAGS = {"script", "img", "iframe", "embed", "source", "audio", "video", "track", "input"}


@dataclass(frozen=True)
class VendoredFile:
    """One vendored file: ``path`` under ``VENDORED``, its sha384 SRI value, the CDN URLs it replaces."""

    path: str
    integrity: str
    urls: tuple[str, ...]
    package: str
    version: str


@dataclass(frozen=True)
class Rewrite:
    """One external URL of a page (``page``, relative to html_dir) that now points at ``local``."""

    page: str
    url: str
    local: str
    integrity: str


def sri(data: bytes, algorithm: str = "sha384") -> str:
    """The Subresource Integrity value of ``data``.

    Example:
        >>> sri(b"")
        'sha384-OLBgp1GsljhM2TJ+sbHjaiH9txEUvgdDTAzHv2P24donTt6/529l+9Ua0vFImLlb'
    """
    return f"{algorithm}-{base64.b64encode(hashlib.new(algorithm, data).digest()).decode()}"


def load_vendor(root: Path = VENDORED) -> dict:
    """``root/vendor.json`` as written by scripts/vendor-dashboard.

    Raises:
        Unavailable: no readable vendor.json (an install without harness' package data).
    """
    try:
        return json.loads((root / "vendor.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise Unavailable(f"cannot read the vendored dashboard files' record {root / 'vendor.json'}: {err} "
                          "(run scripts/vendor-dashboard, or reinstall keras-harness)") from None


def vendored_files(manifest: dict) -> list[VendoredFile]:
    """Every file vendor.json lists, in its order."""
    return [VendoredFile(f["path"], f["integrity"], tuple(f["urls"]), p["name"], p["version"])
            for p in manifest["packages"] for f in p["files"]]


def vendor_problems(root: Path = VENDORED) -> list[str]:
    """Where the files under ``root`` and vendor.json disagree: a listed file missing or with another hash, a
    listed license text missing, a file on disk that vendor.json does not list. Empty when they agree."""
    manifest = load_vendor(root)
    listed = {"vendor.json"}
    problems = []
    for entry in vendored_files(manifest):
        listed.add(entry.path)
        path = root / entry.path
        if not path.is_file():
            problems.append(f"{entry.path}: listed in vendor.json, missing")
        elif sri(path.read_bytes(), entry.integrity.split("-", 1)[0]) != entry.integrity:
            problems.append(f"{entry.path}: its hash is not vendor.json's {entry.integrity}")
    for package in manifest["packages"]:
        for text in package.get("license_files", []):
            listed.add(text)
            if not (root / text).is_file():
                problems.append(f"{text}: {package['name']}'s license text, missing")
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    problems += [f"{extra}: not listed in vendor.json" for extra in sorted(on_disk - listed)
                 if "__pycache__" not in extra]
    return problems


def _external(url: str) -> bool:
    return url.strip().lower().startswith(("http://", "https://", "//"))


@dataclass(frozen=True)
class _Tag:
    start: int  # offset of the tag's text in the page
    text: str  # the start tag as written
    tag: str
    attrs: tuple[tuple[str, str | None], ...]
    attr: str  # the attribute holding the URL


class _Resources(HTMLParser):
    """The start tags of a page that load a URL: scripts, stylesheets (and other loading links), images,
    frames, media."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]  # HTMLParser counts \n only
        self.found: list[_Tag] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        found = dict(attrs)
        if tag == "link":
            rels = set((found.get("rel") or "").lower().split())
            attr = "href" if rels & _LOADING_RELS else None
        elif tag == "object":
            attr = "data"
        else:
            attr = "src" if tag in _SRC_TAGS else None
        if attr and found.get(attr):
            line, column = self.getpos()
            self.found.append(_Tag(self._line_starts[line - 1] + column, self.get_starttag_text() or "", tag,
                                   tuple(attrs), attr))


def external_resources(text: str) -> list[tuple[str, str]]:
    """``(tag, URL)`` of each external (http, https or protocol-relative) resource the HTML ``text`` loads.

    Example:
        >>> external_resources('<script src="https://cdn.example/x.js"></script><script src="a.js"></script>'
        ...                    '<link rel="alternate" href="https://e.example/feed.xml">')
        [('script', 'https://cdn.example/x.js')]
    """
    urls = [(t.tag, str(dict(t.attrs)[t.attr])) for t in _Resources(text).found]
    return [(tag, url) for tag, url in urls if _external(url)]


def _start_tag(tag: _Tag, url: str, integrity: str) -> str:
    attrs = [(name, url if name == tag.attr else value) for name, value in tag.attrs if name != "integrity"]
    at = next(i for i, (name, _) in enumerate(attrs) if name == tag.attr) + 1
    attrs.insert(at, ("integrity", integrity))
    parts = [name if value is None else f'{name}="{html.escape(value, quote=True)}"' for name, value in attrs]
    end = "/>" if tag.text.rstrip().endswith("/>") else ">"
    return f"<{tag.tag} {' '.join(parts)}{end}"


def make_offline(html_dir: str | os.PathLike[str], vendored: Path = VENDORED) -> list[Rewrite]:
    """Rewrites asv publish's pages under ``html_dir`` to load every external script and stylesheet from a
    vendored copy in ``html_dir/vendor/``, each with its own ``integrity`` attribute; returns the rewrites.

    Every page is checked before any is written: where one loads an external URL that no vendored file
    stands in for, nothing changes. Pages already rewritten have no external URL left: running it twice
    is harmless.

    Raises:
        InvalidValue: ``html_dir`` is not a folder.
        Unavailable: a page loads an external URL with no vendored copy (the message names the URL and
            the page; scripts/vendor-dashboard vendors the dashboard's dependencies).
        Failed: the vendored files do not match vendor.json (a damaged install).
    """
    root = Path(html_dir)
    if not root.is_dir():
        raise InvalidValue(f"no published dashboard at {root}: not a folder (run asv publish first)")
    problems = vendor_problems(vendored)
    if problems:
        raise Failed(f"the vendored dashboard files under {vendored} do not match their vendor.json: "
                     f"{'; '.join(problems[:3])} (rerun scripts/vendor-dashboard, or reinstall keras-harness)")
    by_url = {url: entry for entry in vendored_files(load_vendor(vendored)) for url in entry.urls}
    target = root / VENDOR_DIR
    pages = sorted(p for p in root.rglob("*.html") if target not in p.parents)
    rewritten: dict[Path, str] = {}
    rewrites = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(root).as_posix()
        pieces, done = [], 0
        for tag in _Resources(text).found:
            url = str(dict(tag.attrs)[tag.attr])
            if not _external(url):
                continue
            entry = by_url.get(url.strip())
            if entry is None:
                raise Unavailable(f"{name} loads {url}, and harness has no vendored copy of it: the dashboard "
                                  "would not render offline (an asv upgrade may have added a dependency; vendor "
                                  "it with scripts/vendor-dashboard)")
            local = Path(os.path.relpath(target / entry.path, page.parent)).as_posix()
            pieces += [text[done:tag.start], _start_tag(tag, local, entry.integrity)]
            done = tag.start + len(tag.text)
            rewrites.append(Rewrite(name, url, local, entry.integrity))
        if pieces:
            rewritten[page] = "".join(pieces) + text[done:]
    shutil.copytree(vendored, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    for page, text in rewritten.items():
        page.write_text(text, encoding="utf-8")
    return rewrites
