"""`python app.py install-service`: the unit it writes passes `systemd-analyze verify`, holds
the folders the app writes, quotes odd paths; the CLI's outputs and errors. No model, no server.

`systemd-analyze verify` needs no running systemd (it works in a container): it parses the file,
reports unknown or malformed settings on lines naming the file (exit code 0 all the same), and
fails when ExecStart's program is not an executable file. It does not look up User=.
"""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reame.admin.service_unit import (
    UNIT_PATH,
    ServiceUnitError,
    build_unit,
    default_python,
    health_url,
    render_unit,
    run,
)
from reame.config.reame_conf import load_config

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD_ANALYZE = Path("/usr/bin/systemd-analyze")


def verify(text: str, folder: Path) -> list[str]:
    """What `systemd-analyze verify` holds against the unit: its complaints about this file,
    plus the exit code when it is not 0. Empty: the unit is good."""
    if not SYSTEMD_ANALYZE.exists():
        pytest.fail(f"{SYSTEMD_ANALYZE} is missing: install Debian's systemd package "
                    f"(`make tools`, or `apt-get install systemd`)")
    path = folder / "reame.service"
    path.write_text(text, encoding="utf-8")
    result = subprocess.run([str(SYSTEMD_ANALYZE), "verify", "--man=no", str(path)],
                            capture_output=True, text=True, timeout=120)
    output = (result.stdout + result.stderr).splitlines()
    complaints = [line for line in output if path.name in line]
    if result.returncode != 0:
        complaints.append(f"exit code {result.returncode}: {output}")
    return complaints


def setting(text: str, key: str) -> str:
    """The value of the one line `key=...` in a unit."""
    values = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]
    assert len(values) == 1, (key, values)
    return values[0]


def words(value: str) -> list[str]:
    """A space-separated unit value as systemd splits it (double quotes, `%%` for `%`)."""
    return [word.replace("%%", "%") for word in shlex.split(value)]


def write_config(folder: Path, text: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "reame.conf"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def odd_project(tmp_path) -> Path:
    """A project folder whose name needs quoting and escaping, with a working venv python."""
    project = tmp_path / "my 100%pure reame"  # unescaped, %p would become "reame"
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").symlink_to(default_python())
    (project / "app.py").write_text("", encoding="utf-8")
    write_config(project)
    return project


def odd_unit(project: Path) -> str:
    config = load_config(project / "reame.conf")
    return build_unit(config, project=project, python=project / ".venv" / "bin" / "python")


def test_the_real_projects_unit_passes_verify(tmp_path):
    unit = tmp_path / "out" / "reame.service"
    unit.parent.mkdir()
    assert run(["install-service", "--output", str(unit)], ROOT / "reame.conf") == 0
    text = unit.read_text(encoding="utf-8")
    assert verify(text, tmp_path) == []
    assert words(setting(text, "ExecStart")) == [
        str(default_python()), str(ROOT / "app.py"), "--config", str(ROOT / "reame.conf")]
    assert setting(text, "WorkingDirectory") == str(ROOT)
    assert words(setting(text, "ReadWritePaths")) == [str(ROOT)]  # everything is inside
    for line in ("KillSignal=SIGTERM", "TimeoutStopSec=60", "Restart=on-failure",
                 "RestartSec=5", "Type=simple", "After=network-online.target",
                 "Wants=network-online.target", "WantedBy=multi-user.target",
                 "Environment=PYTHONUNBUFFERED=1", "NoNewPrivileges=yes",
                 "ProtectSystem=strict"):
        assert line in text.splitlines()
    assert "finish_writes_on_sigterm" in text


def test_the_interpreter_is_the_one_running_not_its_symlink_target():
    assert default_python() == Path(sys.executable).absolute()
    if sys.prefix != sys.base_prefix:  # in a venv, bin/python links to the base interpreter
        assert Path(sys.prefix) in default_python().parents


@pytest.mark.parametrize("breakage", [
    "bogus setting", "missing program", "unquoted space", "unescaped percent"])
def test_verify_catches_a_broken_unit(tmp_path, odd_project, breakage):
    """The check above can fail: each of these gets a complaint or a non-zero exit code."""
    good = odd_unit(odd_project)
    assert verify(good, tmp_path) == []
    if breakage == "bogus setting":
        bad = good.replace("[Service]\n", "[Service]\nRestartEverySoOften=yes\n")
    elif breakage == "missing program":
        bad = good.replace("/.venv/bin/python", "/no-venv/bin/python")
    elif breakage == "unquoted space":
        bad = good.replace('"', "")
    else:
        bad = good.replace("%%", "%")
    assert bad != good
    assert verify(bad, tmp_path) != []


def test_a_path_with_spaces_and_percent_is_quoted_and_passes_verify(tmp_path, odd_project):
    text = odd_unit(odd_project)
    assert verify(text, tmp_path) == []
    python = odd_project / ".venv" / "bin" / "python"
    assert words(setting(text, "ExecStart")) == [
        str(python), str(odd_project / "app.py"), "--config", str(odd_project / "reame.conf")]
    assert setting(text, "WorkingDirectory") == str(odd_project).replace("%", "%%")  # raw
    assert words(setting(text, "ReadWritePaths")) == [str(odd_project)]


def test_the_default_user_is_reame():
    text = render_unit(project=ROOT, python=ROOT / ".venv" / "bin" / "python",
                       config=ROOT / "reame.conf")
    assert setting(text, "User") == "reame"
    assert setting(text, "Group") == "reame"
    assert UNIT_PATH == Path("/etc/systemd/system/reame.service")


def test_print_writes_the_unit_to_stdout_and_the_steps_to_stderr(tmp_path, capsys):
    default_target = tmp_path / "reame.service"
    code = run(["install-service", "--print"], ROOT / "reame.conf", unit_path=default_target)
    out, err = capsys.readouterr()
    assert code == 0
    assert not default_target.exists()
    assert out.startswith("# Reame as a systemd service")
    assert setting(out, "User") == "reame"
    assert verify(out, tmp_path) == []
    assert "systemctl enable --now reame" in err


def test_output_writes_the_file_and_prints_the_next_steps(tmp_path, capsys):
    config = write_config(tmp_path / "conf", "[server]\nhost = 0.0.0.0\nport = 8123\n"
                                             "allow_anonymous = true\n")
    unit = tmp_path / "reame.service"
    code = run(["install-service", "--config", str(config), "--user", "reame-test-missing",
                "--output", str(unit)], ROOT / "reame.conf")
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    text = unit.read_text(encoding="utf-8")
    assert (setting(text, "User"), setting(text, "Group")) == ("reame-test-missing",) * 2
    assert words(setting(text, "ExecStart"))[-2:] == ["--config", str(config)]
    steps = out.splitlines()
    assert f"  cp {unit} {UNIT_PATH}" in steps
    assert (f"  useradd --system --home {ROOT} --shell /usr/sbin/nologin reame-test-missing"
            in steps)
    assert (f"  chown -R reame-test-missing:reame-test-missing {ROOT} {tmp_path / 'conf'}"
            in steps)
    for command in ("systemctl daemon-reload", "systemctl enable --now reame",
                    "journalctl -u reame -f", "curl http://127.0.0.1:8123/health"):
        assert any(line.strip().startswith(command) for line in steps), command


def test_an_existing_user_is_not_created_again(tmp_path, capsys):
    unit = tmp_path / "reame.service"
    assert run(["install-service", "--user", "root", "--output", str(unit)],
               ROOT / "reame.conf") == 0
    assert "useradd" not in capsys.readouterr().out
    assert setting(unit.read_text(encoding="utf-8"), "Group") == "root"


def test_an_unwritable_default_path_says_what_to_do(tmp_path, capsys):
    """As root every folder is writable: a path under a regular file fails for anyone."""
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    target = tmp_path / "a-file" / "reame.service"
    code = run(["install-service"], ROOT / "reame.conf", unit_path=target)
    out, err = capsys.readouterr()
    assert code != 0
    assert out == ""
    assert err.startswith(f"reame: cannot write {target}: ")
    assert "sudo" in err and "--output FILE" in err and "Traceback" not in err


def test_folders_outside_the_project_land_in_read_write_paths(tmp_path, capsys):
    config = write_config(tmp_path / "conf", f"""
[model]
models_dir = {tmp_path / 'gguf'}
[storage]
sessions_dir = {tmp_path / 'data' / 'sessions'}
[cache]
dir = {tmp_path / 'data' / 'sessions' / 'kv'}
[server]
users_file = ../accounts/users.json
""")
    unit = tmp_path / "reame.service"
    assert run(["install-service", "--config", str(config), "--output", str(unit)],
               ROOT / "reame.conf") == 0
    text = unit.read_text(encoding="utf-8")
    # The KV folder is inside the sessions folder.
    assert words(setting(text, "ReadWritePaths")) == [
        str(ROOT), str(tmp_path / "accounts"), str(tmp_path / "conf"),
        str(tmp_path / "data" / "sessions"), str(tmp_path / "gguf")]
    assert "# PrivateTmp= left out" in text  # a private /tmp would hide these folders
    assert verify(text, tmp_path) == []
    steps = capsys.readouterr().out
    assert f"mkdir -p {tmp_path / 'accounts'} {tmp_path / 'data' / 'sessions'}" in steps


def test_protect_home_stays_only_when_nothing_is_under_a_home_folder(tmp_path):
    outside = render_unit(project=Path("/srv/reame"), python=Path("/srv/reame/.venv/bin/python"),
                          config=Path("/srv/reame/reame.conf"))
    assert "ProtectHome=yes" in outside.splitlines()
    assert "PrivateTmp=yes" in outside.splitlines()
    inside = render_unit(project=Path("/srv/reame"), python=Path("/srv/reame/.venv/bin/python"),
                         config=Path("/srv/reame/reame.conf"),
                         writable=[Path("/home/ann/reame-data")])
    assert "ProtectHome=yes" not in inside
    assert "# ProtectHome= left out: /home/ann/reame-data is under /home." in inside.splitlines()


@pytest.mark.parametrize("text, message", [
    (None, "reame: config file not found"),
    ("[server]\nport = lots\n", "reame: [server] port = 'lots': expected int"),
])
def test_a_missing_or_bad_config_is_named(tmp_path, capsys, text, message):
    config = tmp_path / "reame.conf"
    if text is not None:
        config.write_text(text, encoding="utf-8")
    assert run(["install-service", "--print", "--config", str(config)], config) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message)


def test_a_path_a_unit_cannot_carry_is_refused(tmp_path, capsys):
    config = write_config(tmp_path / 'say "hi"')
    assert run(["install-service", "--print", "--config", str(config)], config) == 2
    assert "cannot be written into a systemd unit" in capsys.readouterr().err
    with pytest.raises(ServiceUnitError):
        render_unit(project=Path("/srv/$HOME"), python=Path("/usr/bin/python3"),
                    config=Path("/srv/reame.conf"))


@pytest.mark.parametrize("host, url", [
    ("127.0.0.1", "http://127.0.0.1:7860/health"),
    ("0.0.0.0", "http://127.0.0.1:7860/health"),
    ("::", "http://[::1]:7860/health"),
    ("chat.example.org", "http://chat.example.org:7860/health"),
])
def test_health_url_reaches_the_server_from_this_machine(tmp_path, host, url):
    config = load_config(write_config(tmp_path, f"[server]\nhost = {host}\n"))
    assert health_url(config.server) == url


def test_running_as_another_user_keeps_its_name_in_the_regenerate_command(tmp_path):
    text = render_unit(project=Path("/srv/reame"), python=Path("/srv/reame/.venv/bin/python"),
                       config=Path("/srv/reame/reame.conf"), user="ann", group="staff")
    assert "install-service --config /srv/reame/reame.conf --user ann" in text
    assert (setting(text, "User"), setting(text, "Group")) == ("ann", "staff")
