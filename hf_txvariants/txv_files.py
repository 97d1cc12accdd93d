"""Writing files and folders so that nothing is lost: the one atomic-file and atomic-folder helpers of the project,
the error that names what a failed write (a full disk) left untouched, and the lock of an output folder.

- `atomic_write_bytes(path, content)`: a temporary file in the same folder, renamed over `path`.
- `atomic_directory(target)`: a context manager yielding a temporary sibling folder that replaces `target` only when
  the block succeeds; on failure (a full disk, an exception, Ctrl-C) `target` is left as it was and the temporary
  folder is removed. Leftovers of a killed process are removed (or, for a replaced folder, restored) the next time
  `target` is written on the same host. Two processes writing the same `target` at once: the second is refused.
- `replace_directory(staging, target)`: the swap itself, for a folder that several processes fill (checkpoints).
- `explained_write_errors(target)`: turns what a failed write raises (OSError, safetensors' and torch's writer
  errors) into one `WriteFailedError` (an OSError) naming `target` and the cause ("No space left on device").
- `folder_lock(lock_path, holder)`: an OS lock (`fcntl.flock`) held for a block; a second holder is refused with a
  `FolderInUseError` naming the first (pid, host, start time); a lock left by a killed process is taken over.

A leaf module: it imports nothing of the project (it ships with the model code in every Hub folder)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import tempfile
import time
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


class FolderInUseError(OSError):
    """Another running process holds the lock of the folder (the message names it)."""


class WriteFailedError(OSError):
    """A write into `filename` failed (`errno`, `strerror`: the cause, e.g. ENOSPC) and left it as it was; the message
    is one line naming both."""

    def __init__(self, code: int, target: str | os.PathLike):
        super().__init__(code, os.strerror(code), str(target))
        self.message = f"could not write {target} (left as it was): {os.strerror(code)}"

    def __str__(self):
        return self.message


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def _process_is_gone(host: str, pid: int) -> bool:
    """True only when the process is certainly not running: it was on this host and no longer exists."""
    if host != _host():
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
    if isinstance(error, FolderInUseError):
        return None
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
        backup = target.with_name(f".{target.name}.txv-{_host()}-{os.getpid()}-old")
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
    `target` and the cause (`explained_write_errors`). While the block runs, a second process writing the same
    `target` is refused (`FolderInUseError`)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with explained_write_errors(target), folder_lock(target.with_name(f".{target.name}.txv.lock"), f"writing {target}"):
        clean_stale_siblings(target)
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.txv-{_host()}-{os.getpid()}-", suffix=".tmp", dir=target.parent)
        )
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


def _read_holder(handle: int) -> dict:
    try:
        os.lseek(handle, 0, os.SEEK_SET)
        return json.loads(os.read(handle, 4096).decode() or "{}")
    except (OSError, ValueError):
        return {}


def describe_holder(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    what = f" ({holder['holder']})" if holder.get("holder") else ""
    return f"process {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}{what}"


@contextmanager
def folder_lock(lock_path: str | os.PathLike, holder: str = "", on_stale=None):
    """Holds an exclusive `fcntl.flock` on `lock_path` for the block, with this process's pid, host, start time and
    `holder` (what it does) written inside. Another process holding it: `FolderInUseError` naming that process. A lock
    file left by a process that was killed (the OS released its lock) is taken over, and `on_stale(message)` is
    called with a line saying so. The file is removed when the block ends. Where the OS has no flock (Windows), the
    block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock_path = Path(lock_path)
    while True:
        handle = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _read_holder(handle)
            os.close(handle)
            raise FolderInUseError(
                errno.EBUSY,
                f"{lock_path.parent} is in use by {describe_holder(other)}: wait for it to finish or "
                f"write elsewhere (lock file {lock_path})",
            ) from None
        except BaseException:
            os.close(handle)
            raise
        try:  # the file may have been removed (and recreated) by the holder that just finished: lock the one in place
            same = os.fstat(handle).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(handle)
    try:
        previous = _read_holder(handle)
        if previous and on_stale is not None:
            on_stale(f"taking over the lock {lock_path} left by {describe_holder(previous)}, which no longer runs")
        record = {"pid": os.getpid(), "host": _host(), "started": time.time(), "holder": holder}
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(record).encode(), 0)
        yield
    finally:
        try:
            lock_path.unlink(missing_ok=True)
        finally:
            os.close(handle)
