"""README.md is the front door and the documentation site holds the depth.

The README stays short: at most 200 lines, with install, the two quick-start commands and a Python example of
the API in its first screenful, and links into docs/ that exist. The site (mkdocs.yml, docs/) builds with
`mkdocs build --strict`, where a broken link or anchor, a page left out of the nav or an API reference that does
not resolve fails the build: shown on the real site, and on copies of it and of a tiny project with each of those
problems planted. The builds need the docs extra; they are `extended` tests (.ci/run's extended step runs them,
and builds the site in its linters too).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 200
SCREENFUL = 80  # lines a newcomer reads before scrolling far
MAIN_JOB = "./scripts/dev-env.sh && .venv/bin/harness compare"
TESTS = "./scripts/dev-env.sh && .venv/bin/pytest -n 2"
_DOCS_LINK = re.compile(r"\]\((docs/[^)#\s]*)(#[^)\s]*)?\)")


def _lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def test_the_readme_has_at_most_200_lines():
    assert len(_lines()) <= MAX_LINES, f"README.md has {len(_lines())} lines; the depth belongs in docs/"


def test_install_the_two_commands_and_the_api_are_in_the_first_screenful():
    first = "\n".join(_lines()[:SCREENFUL])
    assert "pip install keras-harness" in first
    assert f"```bash\n{MAIN_JOB}\n```" in first
    assert f"```bash\n{TESTS}\n```" in first
    example = re.search(r"```python\n(.*?)```", first, re.S)
    assert example, f"no ```python example in README.md's first {SCREENFUL} lines"
    assert "import harness" in example[1] and "harness.parallelize(" in example[1]
    assert len(example[1].splitlines()) <= 12, "the API example is meant to be about ten lines"


def test_every_docs_link_in_the_readme_exists():
    links = _DOCS_LINK.findall(README.read_text(encoding="utf-8"))
    assert len(links) >= 10, "the README links into the docs"
    missing = sorted({path for path, _ in links if not (ROOT / path).is_file()})
    assert missing == [], f"README.md links to docs that do not exist: {missing}"


def test_every_measured_figure_is_in_the_site():
    """scripts/figures' blocks may be shown in README.md too, but each lives in a docs page the site builds."""
    loader = importlib.machinery.SourceFileLoader("figures_script", str(ROOT / "scripts" / "figures"))
    spec = importlib.util.spec_from_loader("figures_script", loader)
    figures = importlib.util.module_from_spec(spec)
    loader.exec_module(figures)
    shown = {m["name"] for path in (ROOT / "docs").glob("**/*.md") for m in figures.BLOCK.finditer(path.read_text())}
    assert set(figures.FIGURES) <= shown, f"figures in no docs page: {sorted(set(figures.FIGURES) - shown)}"


def test_every_docs_page_is_in_the_nav():
    """The nav lists every page (mkdocs' own check, validation.nav.omitted_files, makes it a strict failure)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav) -> list[str]:
        found = []
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            found += pages(value) if isinstance(value, list) else [value]
        return found

    listed = pages(config["nav"])
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").glob("**/*.md"))
    assert sorted(listed) == on_disk


# --- the site's strict build ----------------------------------------------------------------------------------


def _mkdocs() -> list[str]:
    """mkdocs of this Python; a skip where the docs extra is not installed."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install the docs extra)")
    return [sys.executable, "-m", "mkdocs"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", NO_COLOR="1")  # the theme's end-of-life banner: noise here
    return subprocess.run([*_mkdocs(), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.extended
def test_the_site_builds_strict_with_every_page_and_the_api(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in (ROOT / "docs").glob("**/*.md"):
        name = page.relative_to(ROOT / "docs").with_suffix("")
        built = tmp_path / "site" / (name.parent if name.name == "index" else name) / "index.html"
        assert built.is_file(), f"{page} was not built ({built})"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    import harness

    for name in harness.__all__:
        if name != "__version__":  # a string, named in the page's text
            module = harness._LAZY.get(name) or getattr(harness, name).__module__
            assert f'id="{module}.{name}"' in api, f"harness.{name} ({module}) has no entry in docs/api.md"


def _site_copy(tmp_path: Path) -> Path:
    """The site's config and pages under tmp_path; the API reference still read from this checkout's source."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    text = (ROOT / "mkdocs.yml").read_text()
    assert 'paths: ["."]' in text
    (tmp_path / "mkdocs.yml").write_text(text.replace('paths: ["."]', f"paths: [{str(ROOT)!r}]"))
    return tmp_path / "mkdocs.yml"


@pytest.mark.extended
@pytest.mark.parametrize(("page", "plant", "found"), [
    ("index.md", "\nSee [the old page](gone.md).\n", "gone.md"),
    ("index.md", "\nSee [a section](design.md#no-such-section).\n", "no-such-section"),
    ("api.md", "\n::: harness.no_such_name\n", "harness.no_such_name"),
    ("orphan.md", "# A page the nav does not list\n", "orphan.md"),
], ids=["broken-link", "broken-anchor", "unresolved-api-reference", "page-outside-the-nav"])
def test_the_strict_build_fails_on_a_planted_problem(tmp_path, page, plant, found):
    config = _site_copy(tmp_path)
    path = tmp_path / "docs" / page
    path.write_text((path.read_text() if path.exists() else "") + plant)
    done = _build(config, tmp_path / "site")
    assert done.returncode != 0, f"the strict build passed with {plant!r} in {page}"
    assert found in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.extended
def test_strict_mode_fails_on_a_broken_link_in_a_tiny_project(tmp_path):
    """This repository's validation settings on a two-page project: green, then red with a link to no page."""
    validation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["validation"]
    config = {"site_name": "tiny", "docs_dir": "docs", "nav": ["index.md", "other.md"], "validation": validation}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n")
    (tmp_path / "docs" / "index.md").write_text("# Tiny\n\nSee [the other page](other.md).\n")
    good = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert good.returncode == 0, good.stdout + good.stderr
    (tmp_path / "docs" / "index.md").write_text("# Tiny\n\nSee [the other page](othr.md).\n")
    bad = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert bad.returncode != 0 and "othr.md" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
