"""The Settings tab in a real browser: pick a model, apply it live, chat with it; an apply
that fails, which leaves the old model serving; a model downloaded from the Hub (a stand-in on
127.0.0.1, tests/hub_server.py), then offered in the picker.

One server for the module, whose models/ holds the default model and Gemma 3 270M (symlinks).
Only the switch test changes the model; the refusal test works whichever model serves. The
download test has a server of its own, started with HF_ENDPOINT pointing at the stand-in.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import Page, expect

from tests.browser_helpers import (  # noqa: F401 - browser and page are fixtures
    BOT,
    BOX,
    CAPITAL,
    ERROR_BADGE,
    PLANET,
    REPLY_TIMEOUT,
    STATS,
    STATS_TAIL,
    TOAST,
    USER,
    api,
    browser,
    new_chat,
    open_app,
    page,
    send,
    stats_figures,
    without_stats,
)
from tests.conftest import Server, start_server
from tests.hub_server import FakeHub
from tests.reference import assert_answers, model_answer

GEMMA = "gemma-3-270m-q4_k_m.gguf"
STATUS = "#settings-status"
MODEL_INFO = "#model-info"  # the model line above the chat
LOAD_TIMEOUT = 60_000  # ms: checking and loading a 250 MB model on a busy machine


@pytest.fixture(scope="module")
def folder(model_path, gemma_path):
    # A short folder name: the status line shows paths in it.
    with tempfile.TemporaryDirectory(prefix="reame-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        for model in (model_path, gemma_path):
            (folder / "models" / model.name).symlink_to(model)
        yield folder


@pytest.fixture(scope="module")
def server(folder, model_path) -> Server:
    server = start_server(folder, model_path=f"models/{model_path.name}", max_tokens=24)
    yield server
    server.stop()


def open_settings(page: Page) -> None:
    page.get_by_role("tab", name="Settings").click()
    expect(page.locator(STATUS)).to_contain_text("Serving")


def open_chat(page: Page) -> None:
    page.get_by_role("tab", name="Chat").click()
    expect(page.locator(BOX)).to_be_editable()


def mapped_models(server: Server) -> set[str]:
    """The .gguf files the server's processes have mapped into memory (llama.cpp mmaps a
    model; with [model] engine_process the model is in the server's child)."""
    server_process = psutil.Process(server.process.pid)
    pids = [server_process.pid, *(c.pid for c in server_process.children(recursive=True))]
    mapped = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # ended meanwhile
            continue
        mapped |= {Path(line.split(maxsplit=5)[5]).name for line in maps.splitlines()
                   if line.rstrip().endswith(".gguf")}
    return mapped


def record_loading_states(page: Page) -> None:
    """From now on, keep every distinct (status, model line, progress) the page shows."""
    page.evaluate("""() => {
        window.__states = [];
        const text = (selector) => document.querySelector(selector)?.innerText.trim() || '';
        const record = () => {
            const state = [text('#settings-status'), text('#model-info'),
                           text('#model-picker [data-testid=status-tracker]')];
            const last = window.__states[window.__states.length - 1];
            if (!last || last.join('|') !== state.join('|')) window.__states.push(state);
        };
        record();
        new MutationObserver(record).observe(document.body,
            {subtree: true, childList: true, characterData: true});
    }""")


def test_a_model_picked_in_settings_is_loaded_live_and_answers(page, server, model_path,
                                                              gemma_path):
    open_app(page, server)
    expect(page.locator(MODEL_INFO)).to_contain_text(f"Model: {model_path.name}")
    assert mapped_models(server) == {model_path.name}
    open_settings(page)
    expect(page.locator(STATUS)).to_contain_text(model_path.name)

    # The picker says where it looked, and lists both files of models/, described from
    # their headers.
    expect(page.locator("#model-picker")).to_contain_text(
        f"2 model files in {Path(server.config).parent / 'models'}")
    page.locator("#model-picker input").click()
    options = page.locator("#model-picker [role=option]")
    expect(options).to_have_count(2)
    gemma = options.filter(has_text=GEMMA)
    expect(gemma).to_contain_text("gemma3")
    expect(gemma).to_contain_text("chat template no")
    # In plain words, the technical names as hints (issue 30).
    expect(gemma).to_contain_text(re.compile(r"memory per token of history [\d.]+ KB \(KV\)"))
    for label in ("Context length in tokens (n_ctx)", "CPU threads (n_threads; 0 = all cores)",
                  "How a chat's memory is stored (KV cache type)",
                  "Half the memory, nearly the same replies (q8_0)",
                  "Keep chats' history on disk (the KV cache)"):
        expect(page.get_by_text(label, exact=False).first).to_be_visible()
    expect(page.locator("#settings-tab")).to_contain_text(
        "keeps them in the server's reame.conf")
    gemma.click()

    record_loading_states(page)
    page.click("#apply-settings")
    # While it loads: the status says so, with the file's name, and so does the model line
    # above the chat; the progress bar on the picker counts the steps.
    expect(page.locator(STATUS)).to_contain_text(f"Loading model {GEMMA}")
    expect(page.locator(STATUS)).to_contain_text(f"Serving {Path(server.config).parent}",
                                                 timeout=LOAD_TIMEOUT)
    expect(page.locator(STATUS)).to_contain_text(f"/models/{GEMMA}")
    expect(page.locator(TOAST).filter(has_text="Saved to reame.conf and applied")).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    states = page.evaluate("window.__states")
    loading = [n for n, (status, _, _) in enumerate(states)
               if status.startswith(f"Loading model {GEMMA}")]
    serving = [n for n, (status, _, _) in enumerate(states) if GEMMA in status
               and status.startswith("Serving")]
    assert loading and serving and loading[0] < serving[0], states
    assert any(info.startswith(f"Loading model {GEMMA}") for _, info, _ in states[:serving[0]]), \
        states
    steps = [progress for _, _, progress in states[:serving[0]] if progress]
    assert any(f"Loading {GEMMA}" in p for p in steps), states
    assert steps.index(next(p for p in steps if f"Loading {GEMMA}" in p)) > steps.index(
        next(p for p in steps if f"Checking {GEMMA}" in p)), steps

    # The server serves Gemma and no longer holds the old model; reame.conf names the new one.
    settings = api(server).predict(api_name="/get_settings")
    assert settings["loaded_model"].endswith(f"/models/{GEMMA}") and not settings["loading"]
    # The old model's file is let go; Gemma's is mapped, or read into memory where llama.cpp
    # repacks its Q4_K matrices on this CPU ([model] mmap = auto).
    assert mapped_models(server) <= {GEMMA}, "the old model was not freed"
    assert f"model_path = models/{GEMMA}" in Path(server.config).read_text()

    # The chat uses it: the model line says so, and a question gets a sensible answer.
    open_chat(page)
    expect(page.locator(MODEL_INFO)).to_have_text(f"Model: {GEMMA} · context 2,048 tokens")
    reply = send(page, CAPITAL)
    assert_answers(without_stats(reply), model_answer(CAPITAL, model_path=gemma_path))
    line = stats_figures(page)
    assert line.startswith("no cached history · prefilled") and STATS_TAIL.search(line), line


def test_sending_while_a_model_loads_waits_for_it_and_says_so(page, server, folder, model_path,
                                                              gemma_path):
    """Apply, then send at once from the Chat tab: the reply waits, saying the model loads."""
    client = api(server)
    if not client.predict(api_name="/get_settings")["loaded_model"].endswith(model_path.name):
        client.predict({"model": {"model_path": f"models/{model_path.name}"}},
                       api_name="/update_settings")
    open_app(page, server)
    new_chat(page)
    box = page.locator(BOX)
    box.fill(PLANET)  # typed first: it is sent as soon as the load has begun
    open_settings(page)
    # Given through the path field this time (any path works, in models/ or not).
    path_box = page.locator("#model-path input, #model-path textarea")
    path_box.fill(str(folder / "models" / GEMMA))
    path_box.press("Tab")  # the field's value is committed before Apply reads it
    page.click("#apply-settings")
    open_chat(page)
    # The model line above the chat says that a model loads, and which.
    expect(page.locator(MODEL_INFO)).to_contain_text(f"Loading model {GEMMA}")
    expect(box).to_have_value(PLANET)
    box.press("Enter")
    expect(page.locator(USER)).to_have_text([PLANET])
    # Gemma takes about two seconds to check and load here; this shows well within them.
    expect(page.locator(BOT)).to_contain_text(f"Loading model {GEMMA}")
    expect(page.locator(STATS)).to_have_count(1, timeout=REPLY_TIMEOUT)
    expect(page.locator(MODEL_INFO)).to_contain_text(f"Model: {GEMMA}")
    # The reply replaced the notice once the model was loaded.
    assert_answers(without_stats(page.locator(BOT).inner_text()),
                   model_answer(PLANET, model_path=gemma_path))
    assert "Loading model" not in page.locator(BOT).inner_text()
    assert client.predict(api_name="/get_settings")["loaded_model"].endswith(GEMMA)


def test_a_file_that_is_not_a_model_is_refused_and_the_old_model_keeps_serving(page, server,
                                                                             folder):
    client = api(server)
    before = client.predict(api_name="/get_settings")["loaded_model"]
    config_before = Path(server.config).read_bytes()
    notes = folder / "notes.txt"
    notes.write_text("Not a model: just some notes.\n" * 100)

    open_app(page, server)
    open_settings(page)
    path_box = page.locator("#model-path input, #model-path textarea")
    path_box.fill(str(notes))
    path_box.press("Tab")
    page.click("#apply-settings")

    # The error is shown, in the status (which still names the model serving) and as a toast;
    # no "Error" badge covers the form, and the path typed is kept to be corrected.
    status = page.locator(STATUS)
    expect(status).to_contain_text("Not applied", timeout=LOAD_TIMEOUT)
    expect(status).to_contain_text(f"not a GGUF model file: {notes} is not a GGUF file")
    expect(status).to_contain_text(f"Serving {before}")
    expect(page.locator(TOAST).filter(has_text="not a GGUF")).to_be_visible()
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    expect(path_box).to_have_value(str(notes))
    assert client.predict(api_name="/get_settings")["loaded_model"] == before
    assert Path(server.config).read_bytes() == config_before, "reame.conf was written"

    # The old model still answers.
    open_chat(page)
    expect(page.locator(MODEL_INFO)).to_contain_text(f"Model: {Path(before).name}")
    page.click("#new-chat")
    expect(page.locator(USER)).to_have_count(0)
    reply = send(page, PLANET)
    assert_answers(without_stats(reply), model_answer(PLANET, model_path=Path(before)))


HUB_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
PULLED = "smollm2-135m-instruct-q4_1.gguf"  # the default model, under another file name


@pytest.fixture(scope="module")
def hub(model_path):
    with FakeHub({HUB_REPO: {PULLED: model_path.read_bytes(), "README.md": b"# GGUF\n"}}) as hub:
        yield hub


@pytest.fixture(scope="module")
def pull_server(hub, model_path):
    """A server that downloads from the stand-in Hub, whose model lies outside its models
    folder (which does not exist yet): (the server, its folder)."""
    with tempfile.TemporaryDirectory(prefix="reame-") as tmp:
        folder = Path(tmp)
        with pytest.MonkeyPatch.context() as env:  # the server's environment only
            env.setenv("HF_ENDPOINT", hub.url)
            env.setenv("HF_HOME", str(folder / "hf-home"))
            env.delenv("HF_TOKEN", raising=False)
            server = start_server(folder, model_path=model_path, max_tokens=24)
        try:
            yield server, folder
        finally:
            server.stop()


def test_a_model_downloaded_in_settings_is_offered_in_the_picker(page, pull_server, hub,
                                                                 model_path):
    server, folder = pull_server
    models = folder / "models"
    config_before = Path(server.config).read_bytes()
    open_app(page, server)
    open_settings(page)
    # The model lies outside models/: the picker looks in its folder too, and selects it.
    picker, chosen = page.locator("#model-picker"), page.locator("#model-picker input")
    expect(picker).to_contain_text(f"in {models} and {model_path.parent}")
    expect(chosen).to_have_value(re.compile(re.escape(model_path.name)))

    repo_box = page.locator("#pull-repo input, #pull-repo textarea")
    file_box = page.locator("#pull-file input, #pull-file textarea")
    said = page.locator("#pull-status")
    # A repository the Hub does not have: said in the box's status and in a toast.
    repo_box.fill("nobody/nothing-GGUF")
    file_box.fill(PULLED)
    page.click("#pull-model")
    expect(said).to_contain_text("Not downloaded: no repository nobody/nothing-GGUF")
    expect(page.locator(TOAST).filter(has_text="no repository")).to_be_visible()
    # A file that is not a GGUF: refused before the Hub is asked.
    repo_box.fill(HUB_REPO)
    file_box.fill("README.md")
    page.click("#pull-model")
    expect(said).to_contain_text("is not a .gguf file")
    assert not [r for r in hub.requests if r.path.endswith("README.md")]
    assert not models.exists() or not list(models.iterdir())

    file_box.fill(PULLED)
    page.click("#pull-model")
    expect(said).to_contain_text(f"Downloaded {PULLED}", timeout=LOAD_TIMEOUT)
    expect(said).to_contain_text("Apply switches to it")
    assert (models / PULLED).read_bytes() == model_path.read_bytes()
    # Offered: listed, described and selected in the picker. Not switched to: the old model
    # serves, and reame.conf is as it was, until Apply.
    expect(chosen).to_have_value(re.compile(re.escape(PULLED)))
    expect(picker).to_contain_text(re.compile(
        rf"\d+ model files in {re.escape(str(models))} and {re.escape(str(model_path.parent))}"))
    chosen.click()
    expect(page.locator("#model-picker [role=option]").filter(has_text=PULLED)).to_contain_text(
        "llama")
    expect(page.locator("#model-picker [role=option]").filter(
        has_text=model_path.name)).to_have_count(1)
    expect(page.locator(ERROR_BADGE)).to_have_count(0)
    assert api(server).predict(api_name="/get_settings")["loaded_model"] == str(model_path)
    assert Path(server.config).read_bytes() == config_before
