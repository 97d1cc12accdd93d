"""Writing files and folders so that nothing is lost: the one atomic-file and atomic-folder helpers of the project and
the error that names what a failed write (a full disk) left untouched.

- `atomic_write_bytes(path, content)`: a temporary file in the same folder, renamed over `path`.
- `atomic_directory(target)`: a context manager yielding a temporary sibling folder that replaces `target` only when
  the block succeeds; on failure (a full disk, an exception, Ctrl-C) `target` is left as it was and the temporary
  folder is removed. Leftovers of a killed process are removed (or, for a replaced folder, restored) the next time
  `target` is written on the same host. It takes no lock: the commands that write output folders hold
  `hf_txvariants.training.folder_lock` around it (`locked_atomic_directory`), which does not ship with a model.
- `replace_directory(staging, target)`: the swap itself, for a folder that several processes fill (checkpoints).
- `explained_write_errors(target)`: turns what a failed write raises (OSError, safetensors' and torch's writer
  errors) into one `WriteFailedError` (an OSError) naming `target` and the cause ("No space left on device").

A leaf module: it imports nothing of the project (it ships with the model code in every Hub folder)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

WEIGHT_FILE_PATTERN = re.compile(r"^(model.*\.safetensors|pytorch_model.*\.bin)(\.index\.json)?$")
# staging and backup siblings of a folder: .<name>.txv-<host>-<pid>-<random>.tmp and .<name>.txv-<host>-<pid>-old
_SIBLING = re.compile(r"^\.(?P<name>.+)\.txv-(?P<host>.+)-(?P<pid>\d+)-(?P<tag>[a-z0-9_]{8}\.tmp|old)$")
_OS_ERROR_NUMBER = re.compile(r"os error (\d+)")
# torch's zip writer reports a failed write as a RuntimeError from inline_container.cc ("file write failed", "unexpected
# pos"): the cause is not in it, so it is found from the file system
_TORCH_WRITER_FAILURE = ("inline_container", "PytorchStreamWriter", "file write failed")
# what a write into a good folder fails with when the disk (or a quota, a file-size limit, the device) runs out
WRITE_FAILURES = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EROFS})


class WriteFailedError(OSError):
    """A write into `filename` failed (`errno`, `strerror`: the cause, e.g. ENOSPC) and left it as it was; the message
    is one line naming both."""

    def __init__(self, code: int, target: str | os.PathLike):
        super().__init__(code, os.strerror(code), str(target))
        self.message = f"could not write {target} (left as it was): {os.strerror(code)}"

    def __str__(self):
        return self.message


def host_name() -> str:
    """This host's name as the names of staging and backup folders (and lock records) carry it."""
    return socket.gethostname().replace("/", "_") or "localhost"


def _process_is_gone(host: str, pid: int) -> bool:
    """True only when the process is certainly not running: it was on this host and no longer exists."""
    if host != host_name():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _fsync_tree(folder: Path):
    """Flushes every file under `folder` to the disk (some file systems report a full disk only here)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            handle = os.open(path, os.O_RDONLY)
            try:
                os.fsync(handle)
            finally:
                os.close(handle)


def _fsync_folder(folder: Path):
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # some file systems cannot sync a folder; the rename is done either way
        pass
    finally:
        os.close(handle)


def write_failure(error: BaseException, target: str | os.PathLike) -> WriteFailedError | None:
    """The WriteFailedError that says `target` could not be written and why, for an error raised while writing into
    it, or None when `error` is not a failed write (`WRITE_FAILURES`, safetensors' or torch's writer): a missing
    input keeps its message, a bug its traceback."""
    code = getattr(error, "errno", None) if isinstance(error, OSError) else None
    if isinstance(error, OSError) and code not in WRITE_FAILURES:
        return None  # a missing or unreadable input keeps its own message
    if code is None:
        text = str(error)
        found = _OS_ERROR_NUMBER.search(text) if type(error).__name__ == "SafetensorError" else None
        if found:
            code = int(found.group(1))
        elif isinstance(error, RuntimeError) and any(mark in text for mark in _TORCH_WRITER_FAILURE):
            code = _probable_cause(Path(target))
        else:
            return None
    return WriteFailedError(code, target)


def _probable_cause(target: Path) -> int:
    """ENOSPC when the file system of `target` is (nearly) full, EFBIG when a file-size limit (ulimit -f) is set,
    else EIO."""
    folder = target
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        stats = os.statvfs(folder)
        if stats.f_bavail * stats.f_frsize < 1 << 20:
            return errno.ENOSPC
    except OSError:
        pass
    try:
        import resource

        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            return errno.EFBIG
    except (ImportError, OSError, ValueError):
        pass
    return errno.EIO


@contextmanager
def explained_write_errors(target: str | os.PathLike):
    """Re-raises a failed write inside the block as `write_failure(error, target)` (other errors pass unchanged)."""
    try:
        yield
    except Exception as error:
        failure = write_failure(error, target)
        if failure is None:
            raise
        raise failure from error


def clean_stale_siblings(target: str | os.PathLike) -> list[str]:
    """Removes the staging folders next to `target` left by processes of this host that no longer run; a backup of
    `target` whose process died between the two renames of `replace_directory` is put back in place when `target`
    is missing. Returns what was done, one line each."""
    target = Path(target)
    done = []
    if not target.parent.is_dir():
        return done
    for sibling in sorted(target.parent.iterdir()):
        match = _SIBLING.match(sibling.name)
        if not match or match["name"] != target.name or not _process_is_gone(match["host"], int(match["pid"])):
            continue
        if match["tag"] == "old" and not target.exists():
            os.replace(sibling, target)
            done.append(
                f"restored {target} from {sibling.name} (left by process {match['pid']}, killed while replacing it)"
            )
        else:
            shutil.rmtree(sibling, ignore_errors=True)
            done.append(f"removed {sibling} (left by process {match['pid']}, which no longer runs)")
    return done


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _give_default_mode(path: Path, is_dir: bool):
    """The permissions a plain `mkdir` / `open(..., "w")` would have given `path` (tempfile makes 0700 folders and
    0600 files, private to their owner: a saved model or cache must stay readable as any other file is)."""
    os.chmod(path, (0o777 if is_dir else 0o666) & ~_umask())


def replace_directory(staging: Path, target: Path):
    """Moves the finished folder `staging` to `target`, replacing a previous `target` as a whole; the files are
    flushed to the disk first, so a full disk is reported before anything is replaced."""
    _fsync_tree(staging)
    if target.is_dir():
        backup = target.with_name(f".{target.name}.txv-{host_name()}-{os.getpid()}-old")
        shutil.rmtree(backup, ignore_errors=True)
        os.replace(target, backup)
        os.replace(staging, target)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.replace(staging, target)
    _fsync_folder(target.parent)


@contextmanager
def atomic_directory(target: str | os.PathLike, keep_existing: bool = True):
    """Yields a temporary folder next to `target` that replaces `target` only if the block succeeds (the one
    atomic-folder helper of the project: model saving, training outputs and the converters use it).

    With `keep_existing`, files already in `target` that the block did not write are kept (e.g. a tokenizer saved
    before the model), except stale weight files; without it `target` is replaced as a whole. On failure the
    temporary folder is removed, `target` is left as it was, and a failed write is re-raised as an OSError naming
    `target` and the cause (`explained_write_errors`). No lock is taken (`locked_atomic_directory` of
    `hf_txvariants.training.folder_lock` takes one)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with explained_write_errors(target):
        clean_stale_siblings(target)
        prefix = f".{target.name}.txv-{host_name()}-{os.getpid()}-"
        staging = Path(tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=target.parent))
        _give_default_mode(staging, is_dir=True)
        try:
            yield staging
            if target.is_dir() and keep_existing:
                for old in target.iterdir():
                    if not (staging / old.name).exists() and not WEIGHT_FILE_PATTERN.match(old.name):
                        (shutil.copytree if old.is_dir() else shutil.copy2)(old, staging / old.name)
            replace_directory(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def atomic_write(path: str | os.PathLike, write):
    """Calls `write(file)` on a temporary file in the folder of `path` (binary, flushed to the disk), then renames it
    over `path` atomically (the one atomic-file helper of the project, as `atomic_directory` is for folders; `write`
    may stream, e.g. a token cache far larger than memory). A failed write is an OSError naming `path` and the cause,
    and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with explained_write_errors(path):
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            _give_default_mode(Path(temporary), is_dir=False)
            with os.fdopen(handle, "wb") as file:
                write(file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def atomic_write_bytes(path: str | os.PathLike, content: bytes):
    """`atomic_write` of `content`."""
    atomic_write(path, lambda file: file.write(content))
