"""Settings: validate, apply live (switch models), write reame.conf keeping its comments."""

import shutil

import pytest

from reame.admin.live_settings import Settings, SettingsError
from reame.config.reame_conf import load_config
from reame.inference.prompt import PromptMessage
from reame.inference.scope import user_scope
from reame.runtime import build_service

from tests.conftest import ROOT, THREADS
from tests.reference import assert_answers, model_answer


@pytest.fixture
def setup(tmp_path, model_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / model_path.name).symlink_to(model_path)
    text = (ROOT / "reame.conf").read_text()
    text = text.replace("n_ctx = 4096", "n_ctx = 2048").replace("temperature = 0.7",
                                                                "temperature = 0")
    text = text.replace("max_tokens = 512", "max_tokens = 24")
    # The tests' share of the cores (conftest.THREADS), not all of them: under make test two
    # workers' engines each taking both cores wait on each other's threads (a model switch
    # took 19 s in the suite, 3 s alone).
    text = text.replace("n_threads = 0", f"n_threads = {THREADS}")
    assert f"n_threads = {THREADS}" in text
    # The engine in this process: these tests read its KV files and figures directly (a model
    # switch with the engine in its own process: tests/web/page/test_browser_settings.py).
    text = text.replace("engine_process = true", "engine_process = false")
    assert "engine_process = false" in text
    path = tmp_path / "reame.conf"
    path.write_text(text)
    config = load_config(path)
    service = build_service(config)
    return Settings(config, service), path


def last_turn(service, chat_id, text):
    return list(service.send(chat_id, text))[-1]


def test_current_settings_and_models(setup, model_path):
    settings, path = setup
    now = settings.current()
    assert now["settings"]["model"]["n_ctx"] == 2048
    assert now["loaded_model"].endswith(model_path.name)
    [model] = settings.models()
    assert model["architecture"] == "llama" and model["kv_bytes_per_token"] == 23040


def test_switching_to_gemma_and_back_keeps_every_chat_usable(setup, gemma_path, tmp_path):
    settings, path = setup
    service = settings.service
    chat = service.new_chat()
    last_turn(service, chat.id, "Which planet do we live on?")
    kv_dir = service.cache.files.folder
    smol_file = kv_dir / service.cache.files.chat_key(chat.id)
    service.cache.flush()  # KV files are written in the background
    assert smol_file.exists()

    settings.update({"model": {"model_path": gemma_path}})
    assert service.engine.metadata["general.architecture"] == "gemma3"
    assert f"model_path = {gemma_path}" in path.read_text()
    on_gemma = last_turn(service, chat.id, "Say hello.")
    assert on_gemma.stats.source == "none", "the SmolLM2 KV is not restored into Gemma"
    assert on_gemma.text.strip()
    gemma_file = kv_dir / service.cache.files.chat_key(chat.id)
    service.cache.flush()
    assert gemma_file != smol_file and gemma_file.exists() and smol_file.exists()

    settings.update({"model": {"model_path": str(tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")}})
    assert "model_path = models/SmolLM2-135M-Instruct.Q4_1.gguf" in path.read_text()
    back = last_turn(service, chat.id, "Thank you!")
    # The SmolLM2 file still holds the first turn: restored, only the rest recomputed.
    assert back.stats.source == "disk" and back.stats.reused > 20
    assert back.text.strip()


def test_generation_defaults_apply_to_new_chats_and_keep_comments(setup):
    settings, path = setup
    before = path.read_text()
    settings.update({"generation": {"temperature": 0.3, "system_prompt": "Be brief."}})
    after = path.read_text()
    assert [l for l in after.splitlines() if l.startswith("#")] == [
        l for l in before.splitlines() if l.startswith("#")]
    assert "temperature = 0.3" in after and "system_prompt = Be brief." in after
    chat = settings.service.new_chat()
    assert (chat.temperature, chat.system_prompt) == (0.3, "Be brief.")


@pytest.mark.parametrize("changes, message", [
    ({"model": {"model_path": "models/missing.gguf"}}, "does not exist"),
    ({"model": {"n_ctx": 100}}, "allowed range is 256 to 131072"),
    ({"cache": {"kv_type": "q2"}}, "expected one of f16, q8_0"),
    ({"server": {"port": 9999}}, "cannot be changed here"),
    ({"generation": {"top_p": 3}}, "allowed range is 0.0 to 1.0"),
])
def test_invalid_changes_are_refused_and_nothing_is_written(setup, changes, message):
    settings, path = setup
    before = path.read_bytes()
    engine = settings.service.engine
    with pytest.raises(SettingsError, match=message):
        settings.update(changes)
    assert path.read_bytes() == before and settings.service.engine is engine


def test_a_request_tokenized_before_a_model_switch_is_answered_in_the_new_models_tokens(
        setup, gemma_path):
    settings, _ = setup
    service = settings.service
    # More than one chunk of prompt (batches.CHUNK): a prompt's last chunk is evaluated again.
    system = "You are a helpful assistant. Answer in one short sentence. " * 8
    turns = [PromptMessage("user", "Which planet do we live on?")]
    on_smol = len(service.prompts.tokens(system, turns, user_scope(None)))
    updates = service.complete(system, turns, max_tokens=8, temperature=0)  # tokenized now
    settings.update({"model": {"model_path": gemma_path}})  # before it gets the model
    *_, answer = updates
    on_gemma = len(service.prompts.tokens(system, turns, user_scope(None)))
    assert answer.stats.prompt_tokens == on_gemma != on_smol
    # The same answer as the same request sent to Gemma now (its KV live this time).
    *_, again = service.complete(system, turns, max_tokens=8, temperature=0)
    assert again.text == answer.text and again.stats.reused > 0


def test_the_cache_folder_can_move_only_to_a_folder_for_reame_alone(setup, tmp_path):
    settings, path = setup
    service = settings.service
    papers = tmp_path / "papers"
    papers.mkdir()
    (papers / "thesis.tmp").write_text("a draft")
    (papers / "notes.kv").write_text("not a KV file")
    (tmp_path / "a-file").write_text("")
    before = path.read_bytes()
    for folder, message in ((papers, "holds 2 entries Reame did not write"),
                            (tmp_path / "a-file", "is a file, not a folder")):
        with pytest.raises(SettingsError, match=message):
            settings.update({"cache": {"dir": str(folder)}})
        assert path.read_bytes() == before
    assert sorted(p.name for p in papers.iterdir()) == ["notes.kv", "thesis.tmp"]

    # A new folder, or one holding Reame's own files, is fine: the chat's KV goes there.
    chat = service.new_chat()
    last_turn(service, chat.id, "Which planet do we live on?")
    settings.update({"cache": {"dir": str(tmp_path / "kv-elsewhere")}})
    last_turn(service, chat.id, "And the next one out?")
    service.cache.flush()
    assert service.cache.files.folder == tmp_path / "kv-elsewhere"
    assert (tmp_path / "kv-elsewhere" / service.cache.files.chat_key(chat.id)).exists()
    settings.update({"cache": {"dir": str(tmp_path / "sessions" / "kv")}})


def test_a_model_that_fails_to_load_keeps_the_old_one_serving(setup, tmp_path, model_path,
                                                             monkeypatch):
    settings, path = setup
    other = tmp_path / "models" / "other.gguf"
    shutil.copy(model_path, other)
    # What fails is not the subject here: make llama.cpp's full load fail after the checks.
    import reame.inference.engine

    def refuse(*args, **kwargs):
        raise ValueError("Failed to load model from file")

    monkeypatch.setattr(reame.inference.engine, "LlamaModel", refuse)
    before = path.read_bytes()
    engine = settings.service.engine
    with pytest.raises(SettingsError, match="could not load .*other.gguf.* keeps serving"):
        settings.update({"model": {"model_path": str(other)}})
    monkeypatch.undo()
    assert settings.service.engine is engine and path.read_bytes() == before
    chat = settings.service.new_chat()
    assert_answers(last_turn(settings.service, chat.id, "Which planet do we live on?").text,
                   model_answer("Which planet do we live on?"))


def test_kv_type_switch_reloads_and_uses_its_own_files(setup):
    settings, path = setup
    service = settings.service
    chat = service.new_chat()
    last_turn(service, chat.id, "Which planet do we live on?")
    settings.update({"cache": {"kv_type": "q8_0"}})
    assert service.engine.kv_type == "q8_0"
    turn = last_turn(service, chat.id, "Say hello.")
    assert turn.stats.source == "none"
    service.cache.flush()
    assert len(list(service.cache.files.folder.glob(f"chat-{chat.id}-*.kv"))) == 2
