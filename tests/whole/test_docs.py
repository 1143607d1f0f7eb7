"""The documentation holds together (no model, no server): README stays a short front door whose
first commands are make's, its docs/ pages exist, every relative link in README and docs/ leads
to a file (and a #fragment to a heading there), every setting of reame.conf is in
docs/configuration.md, and no run or result is named by an internal counter ("session 29")
instead of its date and commit."""

from __future__ import annotations

import re
from pathlib import Path

from reame.config.reame_conf import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
COUNTER = re.compile(r"\bsessions?[\s-]+\d+", re.I)


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose(text: str) -> str:
    """The text outside code blocks, where links are links."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = prose(page.read_text())
    found = {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"[a-z]+:", target)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.name}")
    return broken


def counters(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if COUNTER.search(line)]


def readme_problems(text: str) -> list[str]:
    """What keeps a README text from being the front door (used on the old README too)."""
    problems = []
    lines = text.splitlines()
    if len(lines) > MAX_README_LINES:
        problems.append(f"{len(lines)} lines, more than {MAX_README_LINES}")
    commands = [line.split("#")[0].strip() for line in lines
                if line.startswith("make ")][:2]
    if commands != ["make run", "make test"]:
        problems.append(f"the first commands are {commands}, not make run and make test")
    problems += [f"named by a counter: {line}" for line in counters(text)]
    return problems


def test_readme_is_a_short_front_door_whose_first_commands_are_make_run_and_make_test():
    assert readme_problems(README.read_text()) == []
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert re.search(rf"^{target}:.*##", makefile, re.M), f"make {target} is not a target"


def test_the_old_notebook_readme_would_fail():
    # README as it was before docs/: 1,737 lines with runs named "session 29".
    old = "\n".join(["# Reame", "```sh", "make run", "make test", "```"]
                    + ["(the last run, session 29)"] + ["text"] * 1731)
    problems = readme_problems(old)
    assert any("more than 200" in p for p in problems)
    assert any("session 29" in p for p in problems)


def test_every_docs_page_readme_links_to_exists():
    linked = [t.partition("#")[0] for t in relative_links(README)
              if t.startswith("docs/") and t.partition("#")[0].endswith(".md")]
    assert len(linked) >= 10, linked
    assert [t for t in linked if not (ROOT / t).is_file()] == []


def test_every_docs_page_is_in_readme_index():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    assert [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked] == []


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = {page.relative_to(ROOT).as_posix(): broken_links(page) for page in pages()}
    assert {page: links for page, links in broken.items() if links} == {}


def test_every_setting_of_reame_conf_is_documented():
    text = (DOCS / "configuration.md").read_text()
    rows = [row for row in text.splitlines() if row.startswith("| ")]
    documented, section = set(), None
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if re.fullmatch(r"`\[\w+\]`", cells[0]):
            section = cells[0][2:-2]
        for key in re.findall(r"`(\w+)`", cells[1] if len(cells) > 1 else ""):
            documented.add((section, key))
    missing = [f"[{s.section}] {s.key}" for s in SETTINGS if (s.section, s.key) not in documented]
    assert missing == []


def test_no_run_or_result_is_named_by_a_counter():
    files = [*pages(), *sorted((ROOT / "bench" / "results").rglob("*.md"))]
    found = {f.relative_to(ROOT).as_posix(): counters(f.read_text()) for f in files}
    assert {name: lines for name, lines in found.items() if lines} == {}
