"""`python app.py install-service`: run Reame as a systemd service.

Renders /etc/systemd/system/reame.service from the project folder, the venv's python and
reame.conf: the service runs as its own user, restarts on failure, and sees the file system
read-only except the folders the app writes (reame.conf's folder, the models, sessions and KV
folders, the users file's folder). Then it prints the commands that remain.
"""

from __future__ import annotations

import argparse
import grp
import pwd
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

from reame.config.connection_limits import OPEN_FILES, TOTAL
from reame.config.reame_conf import Config, ConfigError, ServerConfig, load_config

UNIT_PATH = Path("/etc/systemd/system/reame.service")
PROJECT_DIR = Path(__file__).resolve().parents[2]  # reame/admin/service_unit.py
DEFAULT_USER = "reame"
DEFAULT_DESCRIPTION = "Reame chat server"
STOP_TIMEOUT_S = 60  # SIGTERM waits for the KV files being written; then systemd kills
# ProtectHome= hides these, PrivateTmp= gives the service empty ones of its own.
HOME_FOLDERS = (Path("/home"), Path("/root"), Path("/run/user"))
TMP_FOLDERS = (Path("/tmp"), Path("/var/tmp"))
# Characters a unit cannot carry in a path as written here: control characters end or break
# the line, `"` and `\` change the quoting, and `$` would be expanded in ExecStart's argv[0]
# (python finds its venv from it) while its path must stay literal.
UNSAFE = frozenset('"\\$') | {chr(c) for c in range(32)} | {chr(127)}


class ServiceUnitError(Exception):
    """A path or name cannot be written into a systemd unit."""


def default_python() -> Path:
    """The interpreter running now, absolute but not symlink-resolved: a venv's bin/python is
    a link to the system's, and only the venv's path makes python load the venv's packages."""
    return Path(sys.executable).absolute()


def writable_folders(config: Config, project: Path) -> list[Path]:
    """The folders the app writes that lie outside the project folder, each once.

    reame.conf's folder (the Settings tab rewrites the file), the models folder (downloads),
    the sessions folder (reame.db), the KV folder and the users file's folder (written by
    rename), resolved the way load_config resolves them and through symlinks: a mount
    namespace sees the targets.
    """
    folders = [config.base_dir, config.model.models_dir, config.storage.sessions_dir, config.cache.dir]
    if config.users_path is not None:
        folders.append(config.users_path.parent)
    outside = [f.resolve() for f in folders if not _within(f.resolve(), project.resolve())]
    return _outermost(outside)


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _outermost(folders: Iterable[Path]) -> list[Path]:
    """The folders without those inside another of them, sorted."""
    unique = sorted(set(folders))
    return [f for f in unique if not any(_within(f, other) for other in unique if other != f)]


def _checked(path: Path) -> str:
    text = str(path)
    if not path.is_absolute():
        raise ServiceUnitError(f"{text}: a unit needs an absolute path")
    bad = sorted(UNSAFE.intersection(text))
    if bad or text != text.strip():
        shown = ", ".join(repr(c) for c in bad) or "whitespace at an end"
        raise ServiceUnitError(f"{text!r} cannot be written into a systemd unit ({shown}): "
                               f"move or rename it")
    return text


def _raw(path: Path) -> str:
    """A path for a setting that takes the rest of the line (WorkingDirectory=): only `%`,
    systemd's specifier mark, is escaped."""
    return _checked(path).replace("%", "%%")


def _word(path: Path) -> str:
    """A path as one word of a space-separated list (ExecStart=, ReadWritePaths=): quoted when
    it holds spaces, `%` escaped."""
    text = _raw(path)
    return f'"{text}"' if any(c.isspace() or c == "'" for c in text) else text


def render_unit(*, project: Path, python: Path, config: Path, user: str = DEFAULT_USER,
                group: str | None = None, description: str = DEFAULT_DESCRIPTION,
                writable: Iterable[Path] = (), reads: Iterable[Path] = ()) -> str:
    """The text of reame.service. writable: folders outside the project the app writes
    (writable_folders); reads: other paths it only reads (the model file), which decide
    whether ProtectHome= and PrivateTmp= can stay."""
    for name in (user, group or user):
        if not name or any(c.isspace() or c in UNSAFE or c in "%:/" for c in name):
            raise ServiceUnitError(f"{name!r} is not a user or group name a unit can carry")
    if any(ord(c) < 32 for c in description):
        raise ServiceUnitError(f"{description!r} cannot be a unit's description")
    written = [project, *writable]
    exec_start = " ".join([_word(python), _word(project / "app.py"), "--config", _word(config)])
    lines = [
        *_header(project, python, config, user),
        "",
        "[Unit]",
        f"Description={description.replace('%', '%%')}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"Group={group or user}",
        f"WorkingDirectory={_raw(project)}",
        f"ExecStart={exec_start}",
        "Environment=PYTHONUNBUFFERED=1",
        "Restart=on-failure",
        "RestartSec=5",
        "# On SIGTERM the app first finishes writing the KV files still in flight, then exits",
        "# (finish_writes_on_sigterm in app.py): give it time before systemd sends SIGKILL.",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        f"# Open files: up to {TOTAL:,} connections (reame/config/connection_limits.py), the",
        "# database and the KV files; systemd's default of 1,024 would run out first.",
        f"LimitNOFILE={OPEN_FILES}",
        "",
        *_hardening(written, [python, config, *written, *reads]),
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def _header(project: Path, python: Path, config: Path, user: str) -> list[str]:
    command = [str(python), str(project / "app.py"), "install-service", "--config", str(config)]
    if user != DEFAULT_USER:
        command += ["--user", user]
    return [
        "# Reame as a systemd service, generated by `python app.py install-service`.",
        "# After moving the project or changing the folders in reame.conf, generate it again:",
        f"#   sudo {shlex.join(command)}",
        "#   sudo systemctl daemon-reload && sudo systemctl restart reame",
    ]


def _hardening(written: list[Path], used: list[Path]) -> list[str]:
    """Sandboxing that leaves the app what it needs: everything read-only but the folders it
    writes; ProtectHome= and PrivateTmp= only when no path the app uses lies under them."""
    lines = [
        "# Hardening: the file system is read-only for the service except the folders below.",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={' '.join(_word(path) for path in written)}",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
    ]
    for setting, folders in (("ProtectHome=yes", HOME_FOLDERS), ("PrivateTmp=yes", TMP_FOLDERS)):
        found = first_inside(used, folders)
        if found is None:
            lines.append(setting)
        else:
            lines.append(f"# {setting.split('=')[0]}= left out: {found[0]} is under {found[1]}.")
    return lines


def first_inside(paths: Iterable[Path], folders: tuple[Path, ...]) -> tuple[Path, Path] | None:
    """The first path (as given or through its symlinks) inside one of folders, with it."""
    for path in paths:
        for form in (path, path.resolve()):
            for folder in folders:
                if _within(form, folder):
                    return form, folder
    return None


def build_unit(config: Config, *, project: Path = PROJECT_DIR, python: Path | None = None,
               user: str = DEFAULT_USER, group: str | None = None) -> str:
    """The unit for a loaded reame.conf."""
    return render_unit(project=project, python=python or default_python(),
                       config=config.path or project / "reame.conf", user=user, group=group,
                       writable=writable_folders(config, project),
                       reads=[config.model.model_path])


def health_url(server: ServerConfig) -> str:
    """Where this machine reaches the server's GET /health (any-address hosts: loopback)."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(server.host, server.host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{server.port}/health"


def next_steps(config: Config, *, project: Path, python: Path, user: str, group: str,
               written_to: Path | None, user_exists: bool) -> str:
    """The commands that remain after the unit is written (written_to None: it was printed)."""
    folders = [project, *writable_folders(config, project)]
    missing = [f for f in folders if not f.exists()]
    if written_to is None:
        lines = [f"Save the unit above as {UNIT_PATH}, then as root:"]
    elif written_to == UNIT_PATH:
        lines = [f"Wrote {UNIT_PATH}. Next, as root:"]
    else:
        lines = [f"Wrote {written_to}. Next, as root:",
                 f"  cp {shlex.quote(str(written_to))} {UNIT_PATH}"]
    if not user_exists:
        lines.append(f"  useradd --system --home {shlex.quote(str(project))} "
                     f"--shell /usr/sbin/nologin {user}")
    if missing:
        lines.append(f"  mkdir -p {' '.join(shlex.quote(str(f)) for f in missing)}")
    lines += [
        f"  chown -R {user}:{group} {' '.join(shlex.quote(str(f)) for f in folders)}",
        "  systemctl daemon-reload",
        "  systemctl enable --now reame",
        "  journalctl -u reame -f    # its log; Ctrl-C leaves it running",
        f"  curl {health_url(config.server)}    # {{\"status\": \"ok\"}} once the model is loaded",
    ]
    found = first_inside([python, project], HOME_FOLDERS)
    if found is not None:  # /root and many home folders are closed to other users
        lines.append(f"Note: {found[0]} is under {found[1]}: the user {user} must be able to "
                     f"read it, or the service cannot start (a venv made from /usr/bin/python3, "
                     f"in a folder outside {found[1]}, avoids this).")
    return "\n".join(lines) + "\n"


def _user_and_group(name: str) -> tuple[bool, str]:
    """Whether the user exists here, and the group to run as: its primary group, else the
    group of the same name that `useradd --system` makes."""
    try:
        gid = pwd.getpwnam(name).pw_gid
    except KeyError:
        return False, name
    try:
        return True, grp.getgrgid(gid).gr_name
    except KeyError:
        return True, str(gid)


def parse_args(argv: list[str], default_config: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python app.py install-service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=default_config,
                        help="reame.conf the service reads (default: %(default)s)")
    parser.add_argument("--user", default=DEFAULT_USER,
                        help="user the service runs as (default: %(default)s)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output", type=Path, metavar="FILE",
                       help=f"write the unit to FILE instead of {UNIT_PATH}")
    where.add_argument("--print", action="store_true", help="write the unit to standard output")
    if argv[:1] == ["install-service"]:
        argv = argv[1:]
    return parser.parse_args(argv)


def run(argv: list[str], default_config: Path, *, unit_path: Path = UNIT_PATH,
        project: Path = PROJECT_DIR) -> int:
    """`python app.py install-service [--config PATH] [--user NAME] [--output FILE] [--print]`
    (argv with or without its leading "install-service"). unit_path: where the unit goes
    without --output or --print."""
    args = parse_args(argv, default_config)
    try:
        config = load_config(args.config)
        user_exists, group = _user_and_group(args.user)
        python = default_python()
        text = build_unit(config, project=project, python=python, user=args.user, group=group)
    except (ConfigError, ServiceUnitError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    target = None if args.print else (args.output or unit_path).absolute()
    if target is None:
        sys.stdout.write(text)
    else:
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"reame: cannot write {target}: {exc.strerror or exc}. Run it with sudo, "
                  f"or write the unit elsewhere with --output FILE (or show it with --print).",
                  file=sys.stderr)
            return 1
    steps = next_steps(config, project=project, python=python, user=args.user, group=group,
                       written_to=target, user_exists=user_exists)
    print(steps, end="", file=sys.stderr if target is None else sys.stdout)
    return 0
