"""The docs: the site builds strictly (no broken link, anchor or nav entry), every page is in the
nav, the performance page is what the benchmark results render, and the README keeps its
two-command Quickstart."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import yaml
from launching import REPO
from needs import missing


def mkdocs() -> list[str]:
    found = shutil.which("mkdocs", path=str(pathlib.Path(sys.executable).parent))
    if found is None:
        missing("mkdocs is not installed (the dev extra)")
    return [found]


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([*mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "kubernetes" / "index.html").exists()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """So that the build above can fail: the same site with one link to a missing page does."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\nSee [nowhere](no-such-page.md).\n")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([*mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr


def nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        for value in item.values():
            pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert sorted(nav_pages(config["nav"])) == sorted(p.name for p in (REPO / "docs").glob("*.md"))


def test_the_performance_page_is_what_the_results_render():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_readme_quickstart_is_two_commands_for_a_fresh_clone():
    readme = (REPO / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("##", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quickstart, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make demo", "make test"]
