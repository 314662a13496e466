"""One trainer per model folder: the lock file ``MODEL_DIR/train.lock``.

A trainer creates the lock atomically before it writes anything into the model
folder and removes it when it ends (normally, with an error, or preempted).
The file is JSON naming its holder (host, pid, start time, command). While the
holder runs, a thread refreshes the file's modification time every
``HEARTBEAT_SECONDS``.

A second trainer is refused with :class:`ModelDirInUseError`, unless the lock
is stale, which it then takes over with a one-line warning:

- the holder ran on this machine (same host name, boot and PID namespace) and
  its process is gone (or its PID now belongs to a process started later);
- or it ran elsewhere and its heartbeat is older than ``STALE_AFTER_SECONDS``
  (measured against the time of the model folder's own file system, so clock
  differences between hosts do not matter).

Atomicity: the lock's full content is written to a private temporary file
first, then hard-linked to ``train.lock`` (``os.link`` fails when the name
exists, on local file systems and NFS alike); where hard links are not
supported, ``O_CREAT | O_EXCL`` creates it. A stale lock is replaced only by
the holder of a short-lived takeover mutex (``train.lock.takeover``, created
with ``O_CREAT | O_EXCL``), after checking that the lock is still the one it
judged stale: of several trainers taking over the same stale lock exactly one
wins, and the others find its lock. (A mutex older than
``TAKEOVER_STALE_SECONDS`` belonged to a starter that died mid-takeover and is
removed; only then could two starters race.)
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import pathlib
import secrets
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from t5x.launch._errors import UserError

LOCK_NAME = "train.lock"
HEARTBEAT_SECONDS = 15.0
STALE_AFTER_SECONDS = 120.0
# Transient files of a start: the new lock before it is linked, and the takeover mutex. Neither
# contains ".tmp" (tools take ``*.tmp*`` names for checkpoint saves in progress). New locks older
# than LEFTOVER_SECONDS were left by a starter that died; the next holder removes them.
_NEW, _TAKEOVER = f"{LOCK_NAME}.new-", f"{LOCK_NAME}.takeover"
LEFTOVER_SECONDS = 60.0
TAKEOVER_STALE_SECONDS = 10.0
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS, errno.EMLINK}


class ModelDirInUseError(UserError, RuntimeError):
    """Another trainer holds the model folder's lock.

    Attributes:
      message: the one-line explanation (``str()`` may carry gin's call-site note).
      lock_path: the lock file.
      holder: its JSON content (``host``, ``pid``, ``started``, ``command``), or
        an empty dict when it could not be read.
    """

    def __init__(self, message: str, lock_path: pathlib.Path, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.message, self.lock_path, self.holder = message, lock_path, holder


def _read_text(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _machine() -> str:
    """This machine and PID namespace: boot id plus the namespace's inode ("" where unknown)."""
    boot = (_read_text("/proc/sys/kernel/random/boot_id") or "").strip()
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    return f"{boot}/{namespace}" if boot else ""


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from /proc), or None."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of stat(5); the fields after ")" start at 3


def _process_gone(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's live process
    if start is not None:
        now = _process_start(pid)
        return now is not None and now != start  # the PID was reused
    return False


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unknown holder (the lock file is not readable JSON)"
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {holder.get('started', '?')}"


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ModelDirLock:
    """The lock of one model folder, held by this process (see the module docstring).

    Use :func:`acquire_model_dir_lock` to take it; :meth:`release` (or leaving
    the ``with`` block) removes it.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        command: str | None = None,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        stale_after_seconds: float = STALE_AFTER_SECONDS,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self.model_dir = pathlib.Path(model_dir).absolute()
        self.path = self.model_dir / LOCK_NAME
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_after_seconds = stale_after_seconds
        self.warn = warn
        self.token = secrets.token_hex(16)
        now = time.time()
        self.content: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
            "started_unix": now,
            "command": command if command is not None else shlex.join(sys.argv),
            "machine": _machine(),
            "process_start": _process_start(os.getpid()),
            "token": self.token,
        }
        self.held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- taking it ---------------------------------------------------------
    def acquire(self) -> ModelDirLock:
        """Takes the lock, taking over a stale one.

        Raises:
          ModelDirInUseError: a live trainer holds it (names the holder and the file).
          OSError: the model folder cannot be written (names it).
        """
        if self.held:
            return self
        data = json.dumps(self.content, indent=1) + "\n"
        tmp = self.model_dir / f"{_NEW}{self.token}"
        try:
            with open(tmp, "x") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            raise type(error)(
                error.errno, f"cannot lock the model folder {self.model_dir}: {error.strerror}", str(tmp)
            ) from None
        try:
            # Each round creates the lock, or judges the one found; a lost race goes round again.
            deadline = time.monotonic() + 3 * TAKEOVER_STALE_SECONDS
            while time.monotonic() < deadline:
                if self._create(tmp, data):
                    return self._won(tmp)
                holder_text, holder_mtime = self._read_lock()
                if holder_text is None:
                    continue  # released meanwhile
                os.utime(tmp)
                now = tmp.stat().st_mtime  # the file system's clock, as the holder's heartbeat
                stale_reason = self._stale_reason(holder_text, holder_mtime, now)
                holder = self._parse(holder_text)
                if stale_reason is None:
                    raise self._in_use(holder, now - holder_mtime)
                if self._take_over(holder_text, holder_mtime, tmp, data, now):
                    self.warn(
                        f"[t5x-launch] warning: taking over the stale lock {self.path} of "
                        f"{_describe(holder)} ({stale_reason})"
                    )
                    return self._won(tmp)
            raise RuntimeError(f"could not take the lock {self.path}: it kept changing")
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _won(self, tmp: pathlib.Path) -> ModelDirLock:
        self.held = True
        self._start_heartbeat()
        self._remove_leftovers(tmp.stat().st_mtime)
        return self

    def _create(self, tmp: pathlib.Path, data: str) -> bool:
        """Creates the lock file atomically from ``tmp``; False when it exists."""
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _read_lock(self) -> tuple[str | None, float]:
        try:
            mtime = self.path.stat().st_mtime
            return self.path.read_text(), mtime
        except FileNotFoundError:
            return None, 0.0

    @staticmethod
    def _parse(text: str) -> dict[str, Any]:
        try:
            holder = json.loads(text)
        except ValueError:
            return {}
        return holder if isinstance(holder, dict) else {}

    def _stale_reason(self, text: str, mtime: float, now: float) -> str | None:
        """Why the lock with ``text`` is stale, or None when its holder may be alive."""
        holder = self._parse(text)
        pid = holder.get("pid")
        here = (
            holder.get("host") == self.content["host"]
            and holder.get("machine", "") == self.content["machine"]
        )
        if here and isinstance(pid, int) and _process_gone(pid, holder.get("process_start")):
            return f"process {pid} is gone"
        age = now - mtime
        if not here and age > self.stale_after_seconds:
            return f"no heartbeat for {_age(age)}"
        return None

    def _in_use(self, holder: dict[str, Any], heartbeat: float) -> ModelDirInUseError:
        message = f"the model folder {self.model_dir} is in use by another trainer: {_describe(holder)}"
        if holder.get("command"):
            message += f", command: {holder['command']}"
        if holder.get("host") != self.content["host"]:
            message += (
                f" (last heartbeat {_age(heartbeat)} ago; a lock without one for "
                f"{_age(self.stale_after_seconds)} is taken over)"
            )
        message += f". Lock file: {self.path} (remove it only if that trainer is gone)"
        return ModelDirInUseError(message, self.path, holder)

    def _take_over(self, judged: str, judged_mtime: float, tmp: pathlib.Path, data: str, now: float) -> bool:
        """Replaces the lock judged stale by this one; False when another starter is at it or was faster."""
        mutex = self.model_dir / _TAKEOVER
        try:
            os.close(os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if now - mutex.stat().st_mtime > TAKEOVER_STALE_SECONDS:
                    mutex.unlink()  # its starter died during a takeover
            time.sleep(0.01)
            return False
        try:
            # Inside the mutex nobody else replaces the lock, and a new one cannot appear while
            # the stale one exists: if it is still the one judged, it is ours to replace.
            if self._read_lock() != (judged, judged_mtime):
                return False
            self.path.unlink()
            return self._create(tmp, data)  # False: a starter that found no lock was faster
        finally:
            with contextlib.suppress(FileNotFoundError):
                mutex.unlink()

    def _remove_leftovers(self, now: float) -> None:
        """Removes transient lock files that starters which died left behind."""
        with contextlib.suppress(OSError):
            for path in self.model_dir.iterdir():
                if path.name.startswith(_NEW) and self.token not in path.name:
                    with contextlib.suppress(OSError):
                        if now - path.stat().st_mtime > LEFTOVER_SECONDS:
                            path.unlink()

    # ---- holding it ----------------------------------------------------------
    def _owned(self) -> bool:
        text = _read_text(str(self.path))
        return text is not None and self._parse(text).get("token") == self.token

    def _start_heartbeat(self) -> None:
        if self.heartbeat_seconds <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="t5x-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                if not self._owned():
                    self.warn(
                        f"[t5x-launch] warning: the lock {self.path} was removed or taken over by another "
                        "trainer; two trainers may now write into this model folder"
                    )
                    return
                os.utime(self.path)
            except OSError:
                continue

    def release(self) -> None:
        """Removes the lock file if it still is this lock's; stops the heartbeat."""
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._owned():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def __enter__(self) -> ModelDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire_model_dir_lock(model_dir: str | os.PathLike[str], **options: Any) -> ModelDirLock:
    """Takes ``model_dir``'s trainer lock (see :class:`ModelDirLock` for the options).

    Raises:
      ModelDirInUseError: a live trainer holds it.
      OSError: the model folder cannot be written.
    """
    return ModelDirLock(model_dir, **options).acquire()
