"""Getting a model: `pull REPO FILE` from a stand-in Hub on 127.0.0.1 (tests/hub_server.py),
and the folders the Settings tab's picker lists. No test loads the language model.

The command runs as a process with HF_ENDPOINT set, as a user runs it: huggingface_hub reads
the variable when it is imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

from reame.admin.live_settings import Settings
from reame.config.reame_conf import load_config, update_config
from reame.models.catalog import list_models, model_folders
from reame.models.pull import PullError, pull_model
from reame.web.page.settings_tab import picker_info

from tests.conftest import ROOT
from tests.hub_server import COMMIT, FakeHub

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# `python app.py pull` once app.py hands `pull` to reame.models.pull.run_pull; the module until then.
PULL = [sys.executable, str(ROOT / "app.py"), "pull"]
CHUNK = 10 << 20  # huggingface_hub writes what arrives in pieces of this size


@pytest.fixture(scope="module")
def model_bytes(model_path) -> bytes:
    return model_path.read_bytes()


@pytest.fixture
def hub(model_bytes):
    files = {FILE: model_bytes, "README.md": b"# SmolLM2 GGUF\n",
             "page.gguf": b"<html>Not a model, whatever its name says.</html>\n"}
    with FakeHub({REPO: files}) as hub:
        yield hub


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "reame.conf"
    path.write_text("# test\n[model]\n# where pulled models go\nmodels_dir = models\n")
    return path


def hub_env(url: str, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a pull: this Hub, no token or settings of the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return {**env, "HF_ENDPOINT": url, "HF_HOME": str(home / "hf-home"),
            "HF_HUB_DOWNLOAD_TIMEOUT": "60", **extra}


def pull(hub_url: str, config: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PULL, *args, "--config", str(config)], cwd=ROOT,
                          env=hub_env(hub_url, config.parent, **env), capture_output=True,
                          text=True, timeout=180)


def one_line_error(run: subprocess.CompletedProcess, *expected: str) -> None:
    """Exit 2 with one line on stderr that names the problem: no traceback."""
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("reame: "), run.stderr
    for text in expected:
        assert text in last, run.stderr


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# pull


@pytest.mark.parametrize("models_dir", ["models", "downloads/gguf"])
def test_pull_downloads_the_file_byte_identical_into_models_dir(hub, config, model_bytes,
                                                                models_dir):
    update_config(config, {("model", "models_dir"): models_dir})
    target = (config.parent / models_dir).resolve() / FILE

    run = pull(hub.url, config, REPO, FILE)

    assert run.returncode == 0, run.stderr
    assert target.read_bytes() == model_bytes
    assert files_in(target.parent) == [FILE], "no partial file is left"
    assert f"Downloaded {target}" in run.stdout and "checksum verified" in run.stdout
    assert "llama, 135M parameters, Q4_1, chat template yes" in run.stdout
    assert f"model_path = {os.path.relpath(target, config.parent)}" in run.stdout
    # What was asked: the file's commit, its checksum at that commit, the bytes (at the pinned
    # commit, through the CDN's redirect, whole). Besides, huggingface_hub asks once for its
    # "agent harnesses" list, to name a coding agent in its User-Agent (HF_HUB_DISABLE_TELEMETRY
    # turns that off).
    asked = [r for r in hub.requests if r.path != "/api/agent-harnesses"]
    assert [(r.server, r.method) for r in asked] == [
        ("hub", "HEAD"), ("hub", "POST"), ("hub", "GET"), ("cdn", "GET")]
    assert "/paths-info/" in asked[1].path and asked[3].range is None
    assert asked[2].path == f"/{REPO}/resolve/{COMMIT}/{FILE}"


def test_a_second_pull_of_the_same_file_downloads_nothing(hub, config, model_bytes):
    assert pull(hub.url, config, REPO, FILE).returncode == 0
    run = pull(hub.url, config, REPO, FILE)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"Already there: {config.parent / 'models' / FILE}")
    assert len(hub.seen("cdn")) == 1


def test_the_token_goes_to_the_hub_and_not_to_the_cdn(hub, config):
    assert pull(hub.url, config, REPO, FILE, HF_TOKEN="hf_secret").returncode == 0
    assert {r.authorization for r in hub.requests if r.server == "hub"
            and r.path != "/api/agent-harnesses"} == {"Bearer hf_secret"}
    assert {r.authorization for r in hub.requests if r.server == "cdn"} == {None}


def test_a_dropped_connection_is_resumed_where_it_stopped(hub, config, model_bytes):
    hub.cut_after = 3 * CHUNK + 12345

    run = pull(hub.url, config, REPO, FILE)

    assert run.returncode == 0, run.stderr
    assert (config.parent / "models" / FILE).read_bytes() == model_bytes
    first, again = hub.seen("cdn")
    assert first.range is None and again.range == f"bytes={3 * CHUNK}-", hub.requests


def test_an_interrupted_pull_is_resumed_by_the_next(hub, config, model_bytes):
    models = config.parent / "models"
    hub.stall_after = 4 * CHUNK
    # Ctrl-C reaches the pull as in a terminal, even where the tests themselves run with
    # SIGINT ignored (a suite started in the background by a non-interactive shell: then the
    # pull ignored it too, and ran on). PYTHONFAULTHANDLER: a pull still running 30 s after
    # its Ctrl-C is sent SIGABRT, and its threads' stacks then say where it was.
    process = subprocess.Popen([*PULL, REPO, FILE, "--config", str(config)], cwd=ROOT,
                               env=hub_env(hub.url, config.parent, PYTHONFAULTHANDLER="1"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=sigint_as_in_a_terminal)
    try:
        assert hub.stalled.wait(60), "the download did not start"
        partial = wait_for_partial(models, 4 * CHUNK)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stderr = process.communicate(timeout=30)
            pytest.fail(f"the pull did not end within 30 s of its Ctrl-C; then:\n{stderr}")
    finally:
        process.kill()
        hub.release.set()
    assert process.returncode == 130, stderr
    assert "run the same command again to resume" in stderr and "Traceback" not in stderr
    assert partial.stat().st_size == 4 * CHUNK and not (models / FILE).exists()

    run = pull(hub.url, config, REPO, FILE)

    assert run.returncode == 0, run.stderr
    assert hub.seen("cdn")[-1].range == f"bytes={4 * CHUNK}-"
    assert (models / FILE).read_bytes() == model_bytes
    assert files_in(models) == [FILE]


def sigint_as_in_a_terminal() -> None:
    """In the child, before the pull starts: SIGINT's default action (Python then turns it
    into KeyboardInterrupt), whatever the tests inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_partial(models: Path, size: int) -> Path:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = list(models.glob(f"{FILE}.*.incomplete"))
        if found and found[0].stat().st_size == size:
            return found[0]
        time.sleep(0.05)
    pytest.fail(f"no partial file of {size} bytes in {models}: {files_in(models)}")


def test_a_damaged_download_is_refused_and_nothing_is_kept(hub, config):
    hub.corrupt = True  # damaged bytes under the true sha256
    run = pull(hub.url, config, REPO, FILE)
    one_line_error(run, "does not match the Hub's checksum", "deleted")
    assert files_in(config.parent / "models") == []


def test_a_gguf_named_file_that_is_not_a_model_is_refused_and_deleted(hub, config):
    run = pull(hub.url, config, REPO, "page.gguf")
    one_line_error(run, "page.gguf", "is not a usable GGUF model")
    assert files_in(config.parent / "models") == []


def test_a_file_that_is_not_gguf_is_refused_before_any_request(hub, config):
    run = pull(hub.url, config, REPO, "README.md")
    one_line_error(run, "'README.md' is not a .gguf file")
    assert hub.requests == []  # not even huggingface_hub's own


@pytest.mark.parametrize("args, expected", [
    (["nobody/nothing-GGUF", FILE], "no repository nobody/nothing-GGUF on http://127.0.0.1:"),
    ([REPO, "missing.Q4_K_M.gguf"], f"{REPO} has no file missing.Q4_K_M.gguf"),
    ([REPO, FILE, "--revision", "v9"], f"{REPO} has no revision v9"),
    (["not a repo", FILE], "'not a repo' is not a repository id"),
])
def test_hub_errors_are_one_clear_line(hub, config, args, expected):
    run = pull(hub.url, config, *args)
    one_line_error(run, expected)
    assert files_in(config.parent / "models") == []


def test_no_network_is_one_clear_line(config):
    with FakeHub({}) as gone:
        url = gone.url  # a port nobody listens on once it is closed
    run = pull(url, config, REPO, FILE)
    one_line_error(run, f"cannot reach {url}: nothing answers at that address")
    assert "Errno" not in run.stderr


def test_progress_is_reported_as_the_bytes_arrive(hub, tmp_path, model_bytes):
    seen: list[tuple[int, int]] = []
    pulled = pull_model(REPO, FILE, tmp_path / "models", endpoint=hub.url,
                        on_progress=lambda done, total: seen.append((done, total)))
    assert pulled.downloaded and pulled.path.read_bytes() == model_bytes
    assert pulled.info.architecture == "llama" and pulled.info.path == pulled.path
    assert seen[0] == (0, len(model_bytes)) and seen[-1] == (len(model_bytes),) * 2
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_a_full_disk_is_refused_before_downloading(hub, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr("reame.models.pull.shutil.disk_usage", lambda _: usage(1 << 30, 0, 1 << 20))
    with pytest.raises(PullError, match=r"not enough disk space in .*: the download needs 94 "
                                        r"MB more, 1 MB are free"):
        pull_model(REPO, FILE, tmp_path / "models", endpoint=hub.url)
    assert hub.seen("cdn") == []


def test_another_file_of_the_same_name_is_not_replaced(hub, tmp_path):
    mine = tmp_path / "models" / FILE
    mine.parent.mkdir()
    mine.write_bytes(b"GGUF my own fine-tune")
    with pytest.raises(PullError, match="exists and is not .* move or delete it first"):
        pull_model(REPO, FILE, mine.parent, endpoint=hub.url)
    assert mine.read_bytes() == b"GGUF my own fine-tune"


def test_two_pulls_of_one_file_do_not_write_into_each_other(hub, tmp_path, model_bytes):
    models = tmp_path / "models"
    models.mkdir()
    sha = hashlib.sha256(model_bytes).hexdigest()
    with (models / f"{FILE}.{sha[:12]}.incomplete").open("ab") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # as the pull already under way holds it
        with pytest.raises(PullError, match="is being downloaded by another pull already"):
            pull_model(REPO, FILE, models, endpoint=hub.url)
    assert hub.seen("cdn") == []


# where models are listed


def test_the_picker_looks_in_models_dir_and_beside_the_current_model(tmp_path, model_path):
    project, other = tmp_path / "project", tmp_path / "other"
    (project / "gguf" / "sub").mkdir(parents=True)
    (other / "deeper").mkdir(parents=True)
    current = other / "current.gguf"
    current.symlink_to(model_path)
    for path in (project / "gguf" / "a.gguf", project / "gguf" / "sub" / "b.gguf",
                 other / "c.gguf", other / "deeper" / "d.gguf"):
        path.write_text("not a model")
    (project / "gguf" / "link.gguf").symlink_to(current)  # the current model, twice
    config_path = project / "reame.conf"
    config_path.write_text(f"[model]\nmodel_path = {current}\nmodels_dir = gguf\n")
    config = load_config(config_path)
    assert config.model.models_dir == project / "gguf"

    listed = [c.path for c in list_models(config.model.models_dir,
                                          current=config.model.model_path)]

    # models_dir with its subfolders, the current model's folder alone (not its subfolders);
    # each file once, the current model under its own path, so that the picker selects it.
    assert listed == [project / "gguf" / "a.gguf", current, project / "gguf" / "sub" / "b.gguf",
                      other / "c.gguf"]
    folders = model_folders(config.model.models_dir, config.model.model_path)
    assert folders == [project / "gguf", other]
    assert picker_info(len(listed), folders) == (
        f"4 model files in {project / 'gguf'} and {other}")


def test_a_config_outside_the_project_lists_the_current_models_folder(tmp_path, model_path):
    config_path = tmp_path / "reame.conf"
    config_path.write_text(f"[model]\nmodel_path = {model_path}\n")
    settings = Settings(load_config(config_path), service=None)  # the listing needs no model

    listed = [m["path"] for m in settings.models()]

    assert settings.models_dir == tmp_path / "models"  # the default, beside reame.conf
    assert str(model_path) in listed and len(listed) == len(set(listed))
    assert settings.model_folders() == [tmp_path / "models", model_path.parent]
    assert picker_info(0, settings.model_folders()).startswith(
        f"No .gguf file in {tmp_path / 'models'} or {model_path.parent}.")


def test_the_current_model_inside_models_dir_is_listed_once(tmp_path, model_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / FILE).symlink_to(model_path)
    config_path = tmp_path / "reame.conf"
    config_path.write_text(f"[model]\nmodel_path = models/{FILE}\n")
    settings = Settings(load_config(config_path), service=None)

    assert [m["path"] for m in settings.models()] == [str(tmp_path / "models" / FILE)]
    assert settings.model_folders() == [tmp_path / "models"]
    assert picker_info(1, settings.model_folders()) == f"1 model file in {tmp_path / 'models'}"


class LoadedService:
    """Enough of a ChatService for a change that loads no model (a reload would fail here)."""

    engine = SimpleNamespace(model_path=Path("m.gguf"))
    cache = load_error = loading_model = None
    loading = False

    def set_defaults(self, defaults) -> None:
        pass


def test_models_dir_is_changed_without_a_reload_and_written_relative(tmp_path):
    config_path = tmp_path / "reame.conf"
    config_path.write_text((ROOT / "reame.conf").read_text())
    settings = Settings(load_config(config_path), LoadedService())

    settings.update({"model": {"models_dir": str(tmp_path / "gguf")}})

    text = config_path.read_text()
    assert "\nmodels_dir = gguf\n" in text
    assert "# Folder of GGUF files: the Settings tab lists the ones in it" in text
    assert settings.models_dir == tmp_path / "gguf"
    assert load_config(config_path).model.models_dir == tmp_path / "gguf"
