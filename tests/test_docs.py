"""Every code block of the README and the documentation site runs as written.

Each page is one test: its blocks run top to bottom in a fresh folder, sharing one
namespace (`tests/docs_blocks.py` says how each language runs and how a block that
cannot run here is marked, with its reason). The examples are the pages' tests: a
block's own ``assert`` lines are its checks, and a block that raises fails its page.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from docs_blocks import ROOT, PageRun, blocks_of

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
README = (ROOT / "README.md").read_text(encoding="utf-8")


# Ray Data warns about its own deprecated settings when it reads its context (the Ray page).
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_block_of_the_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a page's saved .py files import as modules
    before = set(sys.modules)
    runner = PageRun(page, tmp_path)
    try:
        for block in blocks_of(page):
            runner.run(block)
    finally:
        runner.close()
        for name in set(sys.modules) - before:  # a page's own modules are not the next page's
            if str(getattr(sys.modules[name], "__file__", None)).startswith(str(tmp_path)):
                del sys.modules[name]
    with capfd.disabled():  # capfd: a child process (an MCP server) needs real fds
        for skipped in runner.skipped:
            print(f"\n  not run: {skipped}", end="")


def test_a_block_marked_skip_says_why_and_an_unknown_language_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    skipped = "<!-- docs: skip needs a key -->\n```python\nraise SystemExit\n```\n"
    page.write_text(skipped + "\n```ruby\nputs 1\n```\n")
    runner = PageRun(page, tmp_path)
    [marked, ruby] = blocks_of(page)
    runner.run(marked)  # not run: it would raise
    assert marked.skip == "needs a key"
    with pytest.raises(AssertionError, match="has no runner"):
        runner.run(ruby)
    runner.close()


def test_a_saved_file_a_shell_block_and_a_background_server_share_the_page_folder(
    tmp_path: Path,
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '```text title="hello.txt"\nhello\n```\n\n'
        "<!-- docs: background http://127.0.0.1:8799/hello.txt -->\n"
        f"```bash\n{sys.executable} -m http.server 8799 --bind 127.0.0.1\n```\n\n"
        "```bash\ncurl -sf localhost:8799/hello.txt > fetched.txt\n```\n\n"
        '```python\nassert open("fetched.txt").read() == "hello\\n"\n```\n'
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    runner = PageRun(page, folder)
    try:
        for block in blocks_of(page):
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(folder)
                runner.run(block)
        [server] = runner.background
    finally:
        runner.close()
    assert server.poll() is not None  # stopped when the page ended


def test_the_site_names_every_page_and_only_pages_that_exist() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def leaves(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [leaf for value in node.values() for leaf in leaves(value)]
        return [leaf for item in node for leaf in leaves(item)]  # type: ignore[attr-defined]

    named = set(leaves(config["nav"]))
    pages = {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}
    assert named == pages


def test_the_site_builds_offline() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert config["theme"]["font"] == "false"  # no font service, at build or view time
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins == {"search", "mkdocstrings"}  # no social cards, no privacy downloads


def test_the_readme_is_short_and_links_the_site() -> None:
    assert len(README.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)\)", README))
    assert {"docs/getting-started.md", "docs/how-to/testing.md"} <= linked
    assert all((ROOT / link).exists() for link in linked)


def test_ci_runs_the_readmes_test_command_and_builds_the_site_after_the_install() -> None:
    found = re.search(r"```sh\n(python3 -m venv \.venv && \S+ install -e '\.\[dev.*?)\n```", README)
    command = found.group(1)
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("python3 -m venv .venv"))
    install, build, checks = lines[at : at + 3]
    assert f"{install} && {checks}" == command  # the README's command, split after the install
    assert "mkdocs build --strict" in build
