"""The layers of reame/ (docs/ARCHITECTURE.md): import-linter's contract in pyproject.toml holds
on the code, and it would catch a lower layer importing a higher one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def test_the_layers_import_only_downwards():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    # A copy of the package where the store (chats) imports the page (web).
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "reame", tmp_path / "reame",
                    ignore=shutil.ignore_patterns("__pycache__"))
    store = tmp_path / "reame" / "chats" / "store" / "database.py"
    store.write_text(store.read_text() + "\nimport reame.web.page  # noqa: E402\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    assert "reame.chats is not allowed to import reame.web" in done.stdout
    assert "reame.chats.store.database -> reame.web.page" in done.stdout
