import pytest

from reame.inference.batches import CHUNK, plan, whole_chunks
from reame.inference.engine import Engine
from reame.inference.llama_params import flash_attention
from reame.inference.sampling import Sampling
from reame.models.gguf_info import read_gguf_info
from reame.models.model_file import ModelLoadError, check_model_file, model_fingerprint
from reame.web.page.render import inert_html

from tests.conftest import THREADS


def test_missing_model_names_the_path_and_lists_the_models_folder(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 16)
    (models / "notes.txt").write_text("x")
    wanted = models / "missing.gguf"
    with pytest.raises(ModelLoadError) as info:
        check_model_file(wanted, models)
    message = str(info.value)
    assert str(wanted) in message and "No such file or directory" in message
    assert "tiny.gguf" in message and "notes.txt" not in message


def test_empty_models_folder_says_so(tmp_path):
    with pytest.raises(ModelLoadError, match="No .gguf files found"):
        check_model_file(tmp_path / "x.gguf", tmp_path)


def test_a_file_that_is_not_gguf_is_refused_before_loading(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>404 Not Found</html>")
    with pytest.raises(ModelLoadError, match="Not a GGUF model file"):
        Engine(fake, n_ctx=512, models_dir=tmp_path)


def test_a_truncated_gguf_fails_with_a_clear_error(tmp_path, model_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model_path.read_bytes()[:4096])
    with pytest.raises(ModelLoadError, match="could not load"):
        Engine(broken, n_ctx=512)


def test_fingerprint_tells_files_apart(tmp_path, model_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"1" * 100)
    b.write_bytes(b"GGUF" + b"2" * 100)
    assert model_fingerprint(a) != model_fingerprint(b)
    assert model_fingerprint(model_path) == model_fingerprint(model_path)


@pytest.fixture(scope="module")
def exact_engine(model_path) -> Engine:
    return Engine(model_path, n_ctx=2048, n_threads=THREADS, exact_reuse=True)


def test_exact_prefill_reuses_whole_chunks_and_continues_after_generated_tokens(exact_engine):
    """[cache] exact: a reused prefix is always what a cold evaluation makes."""
    engine = exact_engine
    engine.clear()
    first = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 16)
    assert engine.prefill(first) == 0
    # The prompt is evaluated in chunks at absolute chunk boundaries (16, 64, then CHUNK's).
    assert [(b.start, b.end) for b in engine.batches] == plan(0, len(first))
    assert all(whole_chunks(b.start) == b.start and not b.kept for b in engine.batches)
    # Another prompt sharing its start reuses only the whole chunks: the KV it gets is the
    # one a fresh evaluation makes.
    before = engine.evaluated
    longer = first + engine.tokenize(" And then it ran away.")
    reused = engine.prefill(longer)
    assert reused == whole_chunks(len(first)) and reused > 0
    assert engine.evaluated - before == len(longer) - reused
    assert [(b.start, b.end) for b in engine.batches] == plan(0, len(longer))
    # The same prompt again right away: its last decode's logits are still live.
    before = engine.evaluated
    assert engine.ready_for(longer) and engine.prefill(longer) == len(longer)
    assert engine.evaluated == before
    # Once the KV moved on, all but its last chunk (evaluated again, as before).
    engine.truncate(len(longer) - 2)
    assert not engine.ready_for(longer)
    assert engine.prefill(longer) == whole_chunks(len(longer) - 1)
    # After generated tokens, a prompt that continues them reuses the whole KV.
    for _ in zip(range(3), engine.generate(Sampling(temperature=0), 3)):
        pass
    grown = list(engine.tokens)
    more = grown + engine.tokenize(" More.")
    assert engine.prefill(more) == len(grown)
    # A diverging prompt keeps only whole chunks of the common part.
    other = first[:CHUNK + 3] + engine.tokenize(" something else")
    assert engine.prefill(other) == CHUNK
    assert engine.tokens == other


def test_by_default_every_shared_token_is_reused(engine):
    """[cache] exact off (the default), as llama-server: a prompt that shares a prefix with the
    live KV anywhere reuses all of it, cut inside a decode if need be; the plan goes on from
    there."""
    engine.clear()
    first = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 16)
    assert len(first) > CHUNK + 10
    engine.prefill(first)
    # Another question on the same history: only what differs is evaluated.
    shared = CHUNK + 7
    other = first[:shared] + engine.tokenize(" something else entirely")
    assert other[shared] != first[shared]
    before = engine.evaluated
    assert engine.prefill(other) == shared
    assert engine.evaluated - before == len(other) - shared
    assert engine.tokens == other
    # The batches still tile the KV: the cut decode's head is a batch of its own, which an
    # exact reuse would stop before (it is no whole chunk).
    assert [(b.start, b.end) for b in engine.batches][:4] == [(0, 16), (16, 64), (64, 128),
                                                              (128, shared)]
    assert engine.batches[-1].end == len(other)
    # Once the KV moved on, the same prompt reuses all but its last token.
    engine.truncate(len(other) - 2)
    before = engine.evaluated
    assert engine.prefill(other) == len(other) - 2
    assert engine.evaluated - before == 2


def test_html_is_inert_outside_code_and_untouched_inside():
    text = "<script>alert(1)</script> **bold** `<b>x</b>`\n```html\n<i>y</i>\n```\n> quote"
    out = inert_html(text)
    assert "<script>" not in out and "&lt;script>" in out
    assert "`<b>x</b>`" in out and "<i>y</i>" in out
    assert "**bold**" in out and "> quote" in out


def test_a_first_chunk_of_16_lets_a_short_shared_opening_be_reused(exact_engine):
    """[cache] exact: chunk boundaries at 16, 64, then every CHUNK: a prompt sharing only a
    short opening with the live KV (a template's header, a short system prompt) still reuses
    its first chunk, as llama-server reuses such a prefix; a system prompt of 64 tokens or
    more is whole chunks too (a snapshot's 64-token blocks, test_cache)."""
    engine = exact_engine
    assert plan(0, 300) == [(0, 16), (16, 64), (64, 128), (128, 256), (256, 300)]
    assert plan(20, 70) == [(20, 64), (64, 70)]
    assert plan(0, 40, kept_from=0) == [(0, 16), (16, 32), (32, 40)]
    opening = engine.tokenize("You are a helpful assistant of the town library. Answer clearly "
                              "and briefly, and in plain words, please.")
    assert 16 <= len(opening) < 64
    engine.clear()
    engine.prefill(opening + engine.tokenize(" What is the capital of France?"))
    before = engine.evaluated
    other = opening + engine.tokenize(" Name three colours of the rainbow.")
    reused = engine.prefill(other)
    assert reused == whole_chunks(len(opening)) == 16
    assert engine.evaluated - before == len(other) - reused


def test_the_same_prompt_again_evaluates_nothing_and_samples_the_same_bits(model_path):
    """A regenerate, or a request sent again: the KV holds the prompt and the reply after it.
    The logits the prompt's last decode made are kept, so nothing is evaluated again, and they
    are the bits a fresh evaluation of the prompt gives (computed here on another slot)."""
    engine = Engine(model_path, n_ctx=1024, n_threads=THREADS, slots=2, exact_reuse=True)
    mine, other = engine.sequences
    prompt = engine.tokenize("<|im_start|>user\nWhich planet do we live on? Answer in a full "
                             "sentence, please.<|im_end|>\n<|im_start|>assistant\n")
    assert 16 < len(prompt) < CHUNK, "its last chunk is most of it"
    engine.use(other)
    engine.prefill(prompt)
    fresh = engine.logits_digest()

    engine.use(mine)
    engine.prefill(prompt)
    reply = [t for _, t in zip(range(6), engine.generate(Sampling(temperature=0), 6))]
    assert len(engine.tokens) == len(prompt) + len(reply) - 1
    engine.use(other)
    engine.prefill(prompt + engine.tokenize(" Earth"))  # another slot decodes meanwhile
    engine.use(mine)
    before = engine.evaluated
    assert engine.prefill(prompt) == len(prompt)
    assert engine.evaluated == before, "nothing evaluated again"
    assert engine.tokens == prompt, "the old reply's KV is gone"
    assert engine.logits_digest() == fresh
    again = [t for _, t in zip(range(6), engine.generate(Sampling(temperature=0), 6))]
    assert again == reply

    # Only while the KV before the prompt's end is the one its logits came from.
    engine.truncate(16)
    assert not engine.recallable(prompt)
    before = engine.evaluated
    assert engine.prefill(prompt) == 16 and engine.evaluated == before + len(prompt) - 16
    assert engine.logits_digest() == fresh
    shorter = prompt[:-1]
    assert not engine.recallable(shorter) and engine.prefill(shorter) == 16
    engine.clear()
    assert not engine.recallable(prompt)


@pytest.mark.parametrize("mode, kv_type, head_dim, on", [
    ("auto", "f16", 64, False),  # SmolLM2, the Qwen2.5-0.5B shape: slower with it
    ("auto", "f16", 128, True),  # Qwen2.5-1.5B: faster (bench.flash_attention)
    ("auto", "f16", None, False),
    ("false", "q8_0", 128, True),  # a quantized V cache needs it
    ("true", "f16", 64, True),
    ("false", "f16", 128, False),
])
def test_flash_attention_follows_the_setting_and_the_heads(mode, kv_type, head_dim, on):
    assert flash_attention(mode, kv_type, head_dim)[0] is on


def test_the_default_model_loads_without_flash_attention_unless_asked(model_path):
    assert read_gguf_info(model_path).head_dim == 64
    assert not Engine(model_path, n_ctx=256, n_threads=THREADS).flash_attn
    assert Engine(model_path, n_ctx=256, n_threads=THREADS, flash_attn="true").flash_attn
