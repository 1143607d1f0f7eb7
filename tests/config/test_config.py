from pathlib import Path

import pytest

from reame.config.reame_conf import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "reame.conf"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_config_reads_with_every_key_commented():
    config = load_config(ROOT / "reame.conf")
    assert config.model.model_path == ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert config.server.host == "127.0.0.1"
    assert config.storage.database_path == ROOT / "sessions" / "reame.db"
    lines = (ROOT / "reame.conf").read_text().splitlines()
    for n, line in enumerate(lines):
        if "=" in line and not line.startswith("#"):
            assert lines[n - 1].startswith("#"), f"key without a comment: {line}"


def test_relative_paths_are_relative_to_the_config_folder(tmp_path):
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    config = load_config(write(sub, "[model]\nmodel_path = m/x.gguf\n[storage]\nsessions_dir = s\n"))
    assert config.model.model_path == sub / "m" / "x.gguf"
    assert config.storage.sessions_dir == sub / "s"


def test_missing_keys_take_defaults(tmp_path):
    config = load_config(write(tmp_path, "[model]\nn_ctx = 1024\n"))
    assert config.model.n_ctx == 1024
    assert config.generation.max_tokens == 512
    assert config.server.port == 7860


def test_malformed_line_is_named(tmp_path):
    path = write(tmp_path, "[model]\nn_ctx = 1024\nthis line has no equals sign\n")
    with pytest.raises(ConfigError, match=r"line 3: this line has no equals sign"):
        load_config(path)


def test_line_before_any_section_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"line 1"):
        load_config(write(tmp_path, "n_ctx = 1\n[model]\n"))


def test_bad_value_names_section_and_key(tmp_path):
    with pytest.raises(ConfigError, match=r"\[model\] n_ctx = 'lots': expected int"):
        load_config(write(tmp_path, "[model]\nn_ctx = lots\n"))


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_a_number_that_is_not_finite_is_refused(tmp_path, raw):
    # NaN compares false with both ends of a range: the old check let it through to the
    # scheduler's share of the slots.
    with pytest.raises(ConfigError, match=rf"\[server\] user_share = '{raw}': expected a finite"):
        load_config(write(tmp_path, f"[server]\nuser_share = {raw}\n"))


def test_out_of_range_value_gives_the_range(tmp_path):
    with pytest.raises(ConfigError, match=r"\[server\] port = 70000: allowed range is 1 to 65535"):
        load_config(write(tmp_path, "[server]\nport = 70000\n"))


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.conf")


def test_update_keeps_comments_order_and_unknown_keys(tmp_path):
    original = (ROOT / "reame.conf").read_text() + "\n[custom]\n# mine\nflavour = mint\n"
    path = write(tmp_path, original)
    from reame.config.reame_conf import update_config

    config = update_config(path, {("model", "n_ctx"): 2048, ("cache", "kv_type"): "q8_0",
                                  ("cache", "enabled"): False})
    assert (config.model.n_ctx, config.cache.kv_type, config.cache.enabled) == (2048, "q8_0", False)
    after = path.read_text()
    changed = [(a, b) for a, b in zip(original.splitlines(), after.splitlines()) if a != b]
    assert changed == [("n_ctx = 4096", "n_ctx = 2048"), ("enabled = true", "enabled = false"),
                       ("kv_type = f16", "kv_type = q8_0")]
    assert len(after.splitlines()) == len(original.splitlines())


def test_update_refuses_bad_values_and_writes_nothing(tmp_path):
    from reame.config.reame_conf import update_config

    path = write(tmp_path, (ROOT / "reame.conf").read_text())
    before = path.read_bytes()
    for changes, message in [
        ({("model", "n_ctx"): 10}, r"allowed range is 256 to 131072"),
        ({("cache", "kv_type"): "q4"}, r"expected one of f16, q8_0"),
        ({("model", "n_ctx"): 2048, ("server", "port"): "eighty"}, r"expected int"),
        ({("model", "nope"): 1}, r"no such setting"),
        ({("server", "user_share"): float("nan")}, r"expected a finite number"),
    ]:
        with pytest.raises(ConfigError, match=message):
            update_config(path, changes)
        assert path.read_bytes() == before
