"""One writer per output folder: the lock of `txv train`'s output folder and of every folder a command writes (`txv
convert`, `txv upgrade-legacy`, the trained model, the token cache). Not shipped in Hub folders: a saved model needs
the atomic writes of `hf_txvariants.txv_files`, not a process lock.

- `folder_lock(lock_path, holder)`: an OS lock (`fcntl.flock`) held for a block; a second holder is refused with a
  `FolderInUseError` naming the first (pid, host, start time); a lock left by a killed process is taken over.
- `locked_atomic_directory(target)`: `txv_files.atomic_directory` under the lock of `target`
  (`.<name>.txv.lock` next to it): a second process writing the same `target` meanwhile is refused.
"""

from __future__ import annotations

import errno
import json
import os
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..txv_files import atomic_directory, explained_write_errors, host_name


class FolderInUseError(OSError):
    """Another running process holds the lock of the folder (the message names it)."""


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
        record = {"pid": os.getpid(), "host": host_name(), "started": time.time(), "holder": holder}
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(record).encode(), 0)
        yield
    finally:
        try:
            lock_path.unlink(missing_ok=True)
        finally:
            os.close(handle)


@contextmanager
def locked_atomic_directory(target: str | os.PathLike, keep_existing: bool = True):
    """`atomic_directory(target, keep_existing)` while this process holds the lock of `target` (`.<name>.txv.lock`
    next to it): a second process writing the same `target` meanwhile is refused (`FolderInUseError` naming this
    one). A lock file that cannot be written (a full disk) is a `WriteFailedError` naming `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        with explained_write_errors(target):
            held.enter_context(folder_lock(target.with_name(f".{target.name}.txv.lock"), f"writing {target}"))
        with atomic_directory(target, keep_existing) as staging:
            yield staging
