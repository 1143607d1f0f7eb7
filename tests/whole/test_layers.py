"""The layers of reame/ (docs/ARCHITECTURE.md): import-linter's contracts in pyproject.toml hold
on the code, and they would catch a lower layer importing a higher one, one face of the web
layer (the page, /v1, the named API) importing another, the shared HTTP parts importing a
face, or the web layer importing the store's rows (reame.chats.store) instead of the chats as
reame.chats returns them (reame/chats/messages.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def lint_with_import(tmp_path: Path, module: str, imported: str) -> subprocess.CompletedProcess:
    """import-linter on a copy of the package where module (a path under reame/) imports
    imported."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copytree(ROOT / "reame", tmp_path / "reame",
                    ignore=shutil.ignore_patterns("__pycache__"))
    source = tmp_path / "reame" / module
    source.write_text(source.read_text() + f"\nimport {imported}  # noqa: E402\n")
    return lint(tmp_path)


def test_the_layers_import_only_downwards():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 kept, 0 broken" in done.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    # A copy of the package where the store (chats) imports the page (web).
    done = lint_with_import(tmp_path, "chats/store/database.py", "reame.web.page")
    assert done.returncode != 0
    assert "reame.chats is not allowed to import reame.web" in done.stdout
    assert "reame.chats.store.database -> reame.web.page" in done.stdout


@pytest.mark.parametrize(("module", "imported"), [
    ("web/v1/common.py", "reame.web.page.render"),
    ("web/page/render.py", "reame.web.gradio_api.named_api"),
    ("web/gradio_api/named_api.py", "reame.web.v1.common"),
])
def test_a_face_importing_another_breaks_their_independence(tmp_path, module, imported):
    done = lint_with_import(tmp_path, module, imported)
    assert done.returncode != 0
    importer = "reame." + module.removesuffix(".py").replace("/", ".")
    face, other = (".".join(name.split(".")[:3]) for name in (importer, imported))
    assert f"{face} is not allowed to import {other}" in done.stdout
    assert f"{importer} -> {imported}" in done.stdout
    assert "web faces: page | v1 | gradio_api, independent BROKEN" in done.stdout


def test_the_shared_http_parts_importing_a_face_break_the_contract(tmp_path):
    # Through http, a face would reach another one: both contracts say so.
    done = lint_with_import(tmp_path, "web/http/user.py", "reame.web.page.render")
    assert done.returncode != 0
    assert "web.http imports none of the faces BROKEN" in done.stdout
    assert "reame.web.http is not allowed to import reame.web.page" in done.stdout
    assert "reame.web.http.user -> reame.web.page.render" in done.stdout
    assert "web faces: page | v1 | gradio_api, independent BROKEN" in done.stdout


@pytest.mark.parametrize(("module", "imported"), [
    ("web/page/render.py", "reame.chats.store"),
    ("web/gradio_api/chat_endpoints.py", "reame.chats.store.tables"),
    ("web/v1/responses.py", "reame.chats.store.stored_responses"),
    ("web/http/user.py", "reame.chats.store.message_tree"),
])
def test_the_web_importing_the_store_breaks_the_contract(tmp_path, module, imported):
    # The faces see chats as ChatService returns them; the store's rows stay in reame/chats.
    done = lint_with_import(tmp_path, module, imported)
    assert done.returncode != 0
    importer = "reame." + module.removesuffix(".py").replace("/", ".")
    assert "web imports nothing from reame.chats.store BROKEN" in done.stdout
    assert "reame.web is not allowed to import reame.chats.store" in done.stdout
    assert f"{importer} -> {imported}" in done.stdout
    assert "3 kept, 1 broken" in done.stdout
