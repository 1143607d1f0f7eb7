"""`python app.py pull REPO FILE`: download a GGUF model from the Hugging Face Hub into
[model] models_dir. The only download Reame makes, and only when a user asks for it.

huggingface_hub 2.4.0's hf_hub_download resumes only within one call: it writes into a temp
file unique to the process and deletes it when the download fails (its PR #4228), so a download
cut by Ctrl-C, a reboot or a long outage starts again from zero. The file is fetched here with
the library's lower-level pieces instead: the HEAD of the resolve URL (the commit), paths-info
(size and the LFS object's sha256), and http_get with resume_size into
`<models_dir>/<file>.<checksum head>.incomplete`, which the next pull of the same file continues.
Only a file whose checksum is the Hub's and whose header is a GGUF's gets its .gguf name: the
picker never lists a partial or a wrong file.

huggingface_hub reads HF_ENDPOINT (a mirror), HF_TOKEN (private and gated repositories) and
HF_HUB_OFFLINE from the environment, as users of other Hub tools expect.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import httpx2  # huggingface_hub's HTTP client: its network errors reach us as they are
from huggingface_hub import HfApi, RepoFile, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import build_hf_headers, silent_tqdm

from reame.config.reame_conf import ConfigError, load_config
from reame.models.gguf_info import GGUFInfo, NotGGUF, read_gguf_info

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes downloaded, bytes in all)
_HASH_CHUNK = 4 << 20
_MB = 1 << 20


class PullError(Exception):
    """A model could not be downloaded; the message says why and what to do."""


@dataclass(frozen=True)
class RemoteFile:
    """A file of a Hub repository at one commit, as the Hub describes it."""

    repo_id: str
    filename: str
    commit: str
    size: int
    sha256: str | None  # of the content, for files stored with LFS (every large file)
    blob_id: str  # git's sha1 of the file as committed: of the content itself when not LFS


@dataclass(frozen=True)
class Pulled:
    path: Path
    info: GGUFInfo
    downloaded: bool  # False: models_dir held this very file already


def local_name(filename: str) -> str:
    """The name the file gets in models_dir; PullError unless it names a .gguf file."""
    path = PurePosixPath(filename.strip())
    if not path.name.lower().endswith(".gguf"):
        raise PullError(f"{filename!r} is not a .gguf file: Reame runs GGUF models only "
                        f"(pick a file ending in .gguf from the repository's files)")
    if path.is_absolute() or ".." in path.parts:
        raise PullError(f"{filename!r}: give the file's path inside the repository")
    return path.name


def pull_model(repo_id: str, filename: str, models_dir: Path, *, revision: str | None = None,
               endpoint: str | None = None, token: str | None = None,
               on_progress: Progress | None = None) -> Pulled:
    """Download repo_id's filename into models_dir, resuming a partial download, and check it.

    endpoint and token default to huggingface_hub's (HF_ENDPOINT, HF_TOKEN or the saved login).
    on_progress(done, total) is told the bytes on disk as they arrive (no terminal bar then).
    """
    repo_id, filename = repo_id.strip(), filename.strip()
    name = local_name(filename)  # before any request
    with _explained(repo_id, filename, revision, endpoint):
        remote = remote_file(repo_id, filename, revision=revision, endpoint=endpoint,
                             token=token)
    target = Path(models_dir) / name
    if target.exists():
        return Pulled(target, _already_there(target, remote), downloaded=False)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PullError(f"cannot make {target.parent}: {exc.strerror}") from None
    partial = target.with_name(f"{name}.{(remote.sha256 or remote.blob_id)[:12]}.incomplete")
    with _only_pull_of(partial) as handle:
        with _explained(repo_id, filename, revision, endpoint):
            _download(remote, handle, partial, endpoint=endpoint, token=token,
                      on_progress=on_progress)
        info = _checked(partial, remote)
        os.replace(partial, target)
    log.info("%s is in %s", name, target.parent)
    return Pulled(target, dataclasses.replace(info, path=target), downloaded=True)


def remote_file(repo_id: str, filename: str, *, revision: str | None = None,
                endpoint: str | None = None, token: str | None = None) -> RemoteFile:
    """What the Hub says of the file: the commit its revision is at, its size and checksum.

    The checksum comes from the repository's metadata (paths-info at that commit), not from
    the download's headers: a CDN or a proxy that damages the bytes cannot vouch for them."""
    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    head = get_hf_file_metadata(url, token=token, endpoint=endpoint)
    if not head.commit_hash:
        raise PullError(f"{_hub(endpoint)} does not answer as a Hugging Face Hub does (no "
                        f"X-Repo-Commit header): check HF_ENDPOINT")
    entries = HfApi(endpoint=endpoint, token=token).get_paths_info(
        repo_id, [filename], revision=head.commit_hash)
    entry = next((e for e in entries if isinstance(e, RepoFile) and e.path == filename), None)
    if entry is None:
        raise PullError(f"{repo_id} has no file {filename} (it is a folder, or the Hub gave "
                        f"no metadata for it)")
    lfs = entry.lfs
    return RemoteFile(repo_id, filename, head.commit_hash, lfs.size if lfs else entry.size,
                      lfs.sha256 if lfs else None, entry.blob_id)


def _download(remote: RemoteFile, handle: BinaryIO, partial: Path, *, endpoint: str | None,
              token: str | None, on_progress: Progress | None) -> None:
    """Append the rest of the file to handle (partial, opened for appending): what it holds
    already is kept, and only the bytes after it are asked for (an HTTP Range)."""
    done = os.fstat(handle.fileno()).st_size
    if done > remote.size:  # not this file's beginning
        handle.truncate(0)
        done = 0
    _check_space(partial.parent, remote.size - done)
    if done:
        log.info("resuming %s at %.0f of %.0f MB", remote.filename, done / _MB,
                 remote.size / _MB)
    url = hf_hub_url(remote.repo_id, remote.filename, revision=remote.commit,
                     endpoint=endpoint)
    bar = _reporting_bar(lambda n: on_progress(n, remote.size)) if on_progress else None
    try:
        # http_get itself resumes (Range) after a dropped connection, a few times.
        http_get(url, handle, resume_size=done, headers=build_hf_headers(token=token),
                 expected_size=remote.size, displayed_filename=remote.filename,
                 tqdm_class=bar)
        # On disk before it is checked and renamed: a power cut must not leave a .gguf that
        # was never written.
        handle.flush()
        os.fsync(handle.fileno())
    except HfHubHTTPError:
        raise
    except httpx2.TransportError as exc:
        raise PullError(f"the download of {remote.filename} was cut off ({exc}); "
                        f"{_kept(handle)}") from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise PullError(f"the disk of {partial.parent} is full; {_kept(handle)} once "
                            f"there is room") from None
        raise PullError(f"the download of {remote.filename} failed: "
                        f"{str(exc).splitlines()[0]}; {_kept(handle)}") from None


def _kept(handle: BinaryIO) -> str:
    handle.flush()
    done = os.fstat(handle.fileno()).st_size
    return (f"the {done / _MB:,.0f} MB downloaded are kept: run the same command again to "
            f"resume")


def _check_space(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise PullError(f"not enough disk space in {folder}: the download needs "
                        f"{needed / _MB:,.0f} MB more, {free / _MB:,.0f} MB are free")


def _checked(partial: Path, remote: RemoteFile) -> GGUFInfo:
    """The downloaded file's header, if its checksum is the Hub's and it is a GGUF; else it
    is deleted (a resumed download cannot tell which part went wrong) and PullError says so."""
    if not _same_content(partial, remote):
        partial.unlink()
        raise PullError(f"{remote.filename} from {remote.repo_id} does not match the Hub's "
                        f"checksum: the download was damaged and is deleted; run the command "
                        f"again")
    try:
        return read_gguf_info(partial)
    except (NotGGUF, OSError) as exc:
        partial.unlink()
        reason = str(exc).replace(str(partial), "the file")
        raise PullError(f"{remote.filename} from {remote.repo_id} is not a usable GGUF model "
                        f"({reason}); it is deleted") from None


def _already_there(target: Path, remote: RemoteFile) -> GGUFInfo:
    """The header of target if it is the Hub's file already; PullError if another file has
    its name (it is not replaced: it may be a model someone uses)."""
    if not target.is_file() or not _same_content(target, remote):
        raise PullError(f"{target} exists and is not {remote.filename} of {remote.repo_id} "
                        f"(its content differs): move or delete it first")
    try:
        return read_gguf_info(target)
    except (NotGGUF, OSError) as exc:
        raise PullError(f"{target} is the Hub's file but not a usable GGUF model: {exc}") from None


def _same_content(path: Path, remote: RemoteFile) -> bool:
    """Whether path holds the Hub's bytes: the LFS sha256, or git's blob sha1 when the file
    is stored in git itself (small files)."""
    if path.stat().st_size != remote.size:
        return False
    if remote.sha256:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(f"blob {remote.size}\0".encode())
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == (remote.sha256 or remote.blob_id)


def _reporting_bar(report: Callable[[int], None]) -> type:
    """A progress bar class for http_get that passes the bytes on disk to report."""

    class Bar(silent_tqdm):
        def __init__(self, *args, initial: int = 0, **kwargs):
            self.n = initial
            report(self.n)

        def update(self, n: int | float | None = 1) -> None:
            self.n += int(n or 0)
            report(self.n)

    return Bar


@contextmanager
def _only_pull_of(partial: Path) -> Iterator[BinaryIO]:
    """The partial file, open for appending, locked: a second pull of the same file (the
    command line and the Settings tab at once) would write into it too."""
    try:
        handle = partial.open("ab")
    except OSError as exc:
        raise PullError(f"cannot write {partial}: {exc.strerror}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(f"{partial.name} is being downloaded by another pull "
                            f"already") from None
        yield handle


def _hub(endpoint: str | None) -> str:
    return (endpoint or constants.ENDPOINT).rstrip("/")


@contextmanager
def _explained(repo_id: str, filename: str, revision: str | None,
               endpoint: str | None) -> Iterator[None]:
    """The Hub's and the network's errors as one line that says what to do."""
    hub = _hub(endpoint)
    at = f" at revision {revision}" if revision else ""
    try:
        yield
    except GatedRepoError:
        raise PullError(f"{repo_id} is gated: accept its terms at {hub}/{repo_id}, then set "
                        f"HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise PullError(f"no repository {repo_id} on {hub} (if it is private, set "
                        f"HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise PullError(f"{repo_id} has no revision {revision}") from None
    except RemoteEntryNotFoundError:
        raise PullError(f"{repo_id} has no file {filename}{at}: its files are listed at "
                        f"{hub}/{repo_id}/tree/{revision or 'main'}") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "an error"
        detail = exc.server_message or str(exc).strip().splitlines()[0]
        raise PullError(f"{hub} answered {status} for {repo_id}/{filename}: {detail}") from None
    except OfflineModeIsEnabled:
        raise PullError("HF_HUB_OFFLINE is set: unset it to download") from None
    except HFValidationError as exc:
        raise PullError(f"{repo_id!r} is not a repository id (owner/name): "
                        f"{str(exc).strip().splitlines()[0]}") from None
    except httpx2.TimeoutException:
        raise PullError(f"{hub} did not answer in time: try again later") from None
    except httpx2.TransportError as exc:
        raise PullError(f"cannot reach {hub}: {_unreachable(exc)}") from None


def _unreachable(exc: Exception) -> str:
    """Why a host cannot be reached, in words rather than the socket's "[Errno 111]"."""
    text = str(exc)
    if "refused" in text.lower():
        return ("nothing answers at that address (connection refused): check the address "
                "(HF_ENDPOINT) or whether this machine may reach it")
    if any(k in text.lower() for k in ("name or service", "temporary failure in name",
                                        "nodename nor servname", "getaddrinfo")):
        return "its name does not resolve: is this machine online?"
    if "unreachable" in text.lower():
        return "the network is unreachable from this machine"
    return re.sub(r"\[Errno -?\d+\]\s*", "", text) or type(exc).__name__


def run_pull(argv: list[str], default_config: Path) -> int:
    """`python app.py pull REPO FILE [--config PATH] [--revision REV]`; argv is what follows
    `pull`. Prints where the model is and how to use it; errors are one line, exit 2."""
    parser = argparse.ArgumentParser(
        prog="python app.py pull",
        description="Download a GGUF model from the Hugging Face Hub into [model] models_dir.")
    parser.add_argument("repo", help="repository on the Hub, e.g. owner/Model-GGUF")
    parser.add_argument("file", help="the .gguf file in it, e.g. model.Q4_K_M.gguf")
    parser.add_argument("--config", type=Path, default=default_config,
                        help="reame.conf whose models_dir receives the file (default: "
                             "%(default)s)")
    parser.add_argument("--revision", help="branch, tag or commit (default: main)")
    args = parser.parse_args(argv)
    # httpx2 logs every request at INFO: four lines around the progress bar say nothing more.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        local_name(args.file)  # refused before the config is even read
        config = load_config(args.config)
        pulled = pull_model(args.repo, args.file, config.model.models_dir,
                            revision=args.revision)
    except (ConfigError, PullError) as exc:
        print(f"reame: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reame: interrupted; what was downloaded is kept: run the same command again "
              "to resume", file=sys.stderr)
        return 130
    print(pulled_text(pulled, config.path))
    return 0


def pulled_text(pulled: Pulled, config_path: Path | None) -> str:
    """Where the model is, what it is, and the ways to switch to it."""
    i = pulled.info
    verb = "Downloaded" if pulled.downloaded else "Already there:"
    base = config_path.parent if config_path else Path.cwd()
    shown = pulled.path.relative_to(base) if pulled.path.is_relative_to(base) else pulled.path
    return (f"{verb} {pulled.path} ({i.size / _MB:,.0f} MB, checksum verified): "
            f"{i.architecture}, {i.parameters / 1e6:,.0f}M parameters, {i.quantization}, "
            f"chat template {'yes' if i.has_chat_template else 'no'}.\n"
            f"To use it: pick it in the Settings tab and press Apply, or set\n"
            f"    model_path = {shown}\n"
            f"in [model] of {config_path or 'reame.conf'}, or run once with "
            f"`python app.py --model {pulled.path}`.")

