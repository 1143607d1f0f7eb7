"""Every setting's checks are generated from its one declaration (reame/config/setting.py):
reame.conf, a chat's settings (the named API, the page and imports change them through
ChatSettings.changed) and /v1 follow a change made there, with no second place edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from reame.config.chat_settings import FIELD, FIELDS, ChatSettings, SettingValueError
from reame.config.setting import Setting, first_problem, settings_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_model_of_a_group_of_settings_has_their_types_ranges_defaults_and_help():
    model = settings_model("Example", (
        Setting("s", "share", float, 0.5, "a share", 0.0, 1.0, low_open=True),
        Setting("s", "count", int, 3, "how many", 1, 9),
        Setting("s", "kind", str, "a", "which", choices=("a", "b")),
    ))
    assert model().model_dump() == {"share": 0.5, "count": 3, "kind": "a"}
    assert model.model_fields["count"].description == "how many"
    assert model.model_validate({"share": 1, "count": 9, "kind": "b"}).share == 1.0
    for values, problem in [({"share": 0.0}, ("share", "range")),  # low_open: 0 excluded
                            ({"count": 10}, ("count", "range")),
                            ({"count": "5"}, ("count", "type")),  # strict: a text is no number
                            ({"share": True}, ("share", "type")),
                            ({"share": float("nan")}, ("share", "type")),
                            ({"kind": "c"}, ("kind", "type"))]:
        with pytest.raises(ValidationError) as refused:
            model.model_validate(values)
        assert first_problem(refused.value) == problem


def test_chat_settings_are_checked_by_the_model_generated_from_their_declarations():
    model = settings_model("ChatSettings", FIELDS)
    assert model().model_dump() == ChatSettings().as_dict()
    schema = model.model_json_schema()["properties"]["temperature"]
    assert (schema["minimum"], schema["maximum"], schema["default"]) == (
        FIELD["temperature"].minimum, FIELD["temperature"].maximum, FIELD["temperature"].default)
    with pytest.raises(SettingValueError, match="top_p must be above 0 and at most 1"):
        ChatSettings().changed(top_p=0)


# Run in a copy of reame/ whose one declaration of temperature was changed.
CHECKS = """
import tempfile
from pathlib import Path

from reame.chats.service import ChatService
from reame.chats.store import Store
from reame.config.chat_settings import ChatSettings
from reame.config.reame_conf import ConfigError, load_config, setting
from reame.config.setting import settings_model
from reame.web.v1.chat_request import parse_request
from reame.web.v1.errors import ApiError

folder = Path(tempfile.mkdtemp())
conf = folder / "reame.conf"
conf.write_text("[model]\\nn_ctx = 1024\\n")
assert load_config(conf).generation.temperature == 1.5  # the new default
model = settings_model("generation", tuple(s for s in (setting("generation", k) for k in (
    "system_prompt", "temperature", "top_p", "max_tokens"))))
assert model().temperature == 1.5
conf.write_text("[generation]\\ntemperature = 4.5\\n")
assert load_config(conf).generation.temperature == 4.5  # in the new range
conf.write_text("[generation]\\ntemperature = 6\\n")
try:
    load_config(conf)
    raise AssertionError("6 was taken")
except ConfigError as exc:
    assert "allowed range is 0.0 to 5.0" in str(exc), exc

# What /update_chat (the named API), the page and an import change a chat's settings with.
service = ChatService(Store(folder / "reame.db"), None, ChatSettings())
chat = service.new_chat()
assert chat.temperature == 1.5
assert service.update_settings(chat.id, temperature=4.5).temperature == 4.5
try:
    service.update_settings(chat.id, temperature=6)
    raise AssertionError("6 was taken")
except ValueError as exc:
    assert str(exc) == "temperature must be between 0 and 5", exc

body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
assert parse_request({**body, "temperature": 4.5}, ["m"]).temperature == 4.5
try:
    parse_request({**body, "temperature": 6}, ["m"])
    raise AssertionError("6 was taken")
except ApiError as exc:
    assert exc.message == "'temperature' must be a number between 0 and 5", exc.message
print("followed")
"""


def test_a_changed_declaration_changes_every_check_with_no_second_place_edited(tmp_path):
    shutil.copytree(ROOT / "reame", tmp_path / "reame",
                    ignore=shutil.ignore_patterns("__pycache__"))
    declarations = tmp_path / "reame" / "config" / "chat_settings.py"
    before = declarations.read_text()
    after = before.replace('"temperature", float, 0.7, "sampling temperature; 0 = greedy",\n'
                           '            0.0, 2.0)',
                           '"temperature", float, 1.5, "sampling temperature; 0 = greedy",\n'
                           '            0.0, 5.0)')
    assert after != before, "the declaration of temperature moved: update this test"
    declarations.write_text(after)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECKS)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path),
                               "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.stdout.strip() == "followed", done.stderr[-3000:]
