"""The house keeps its shape: no module in reame/ over MAX_LINES lines, and no two modules
that import each other anywhere in the repository (reame/, bench/, tests/), lazy imports
inside functions included (grimp, import-linter's graph, sees those too)."""

from __future__ import annotations

import grimp
import pytest

from tests.conftest import ROOT

MAX_LINES = 400


def test_no_module_of_reame_is_over_the_limit():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in (ROOT / "reame").rglob("*.py")}
    assert len(sizes) > 50, "the package was not found"
    over = {path: n for path, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines (split each along a seam it has): {over}"


@pytest.mark.parametrize("package", ["reame", "bench", "tests"])
def test_no_two_modules_import_each_other(package):
    graph = grimp.build_graph(package, include_external_packages=False)
    assert len(graph.modules) > 10, graph.modules
    mutual = sorted((a, b) for a in graph.modules
                    for b in graph.find_modules_directly_imported_by(a)
                    if a < b and a in graph.find_modules_directly_imported_by(b))
    assert not mutual, f"modules that import each other: {mutual}"


def test_the_tests_mirror_the_source():
    """Each folder of tests/ is a package of reame/ (its tests), but whole/ (the server as a
    whole: security, chaos, fuzzing, the house itself) and data/; no test file is left at the
    top."""
    folders = {path.relative_to(ROOT / "tests").as_posix()
               for path in (ROOT / "tests").rglob("test_*.py")}
    assert folders, "no tests found"
    top = sorted(f for f in folders if "/" not in f)
    assert not top, f"test files outside a package's folder: {top}"
    for folder in {f.rsplit("/", 1)[0] for f in folders}:
        assert folder == "whole" or (ROOT / "reame" / folder / "__init__.py").exists(), (
            f"tests/{folder} mirrors no package of reame/")
