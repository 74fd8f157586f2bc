"""The one file writer of the project: atomic, and never destructive.

Every file the project writes (models, checkpoints, results, figures, predictions, torch exports) goes
through ``atomic_write``:

* the data go to a temp file beside the target (``.tmp-<pid>-<random>-<name>``), are flushed and
  fsync'ed, then renamed over the target, so an interrupted write never leaves a half-written file;
* the temp file is removed on every exit path (an exception, Ctrl-C); a ``kill -9`` can still leave
  one, and the next write of the same target removes the temp files of processes that no longer run;
* it refuses, with ``UnsafeOutputError`` and nothing changed, to replace anything that is not a
  regular file: a directory, a device node, a FIFO, a socket.  A symbolic link is followed: the file it
  points to is replaced (atomically, in that file's folder) and the link stays a link; a link whose
  target is not a regular file, or that dangles, is refused like that target.

Commands that read inputs and write an output call ``check_output`` before doing any work: it applies
the same rules, refuses an output that is one of the command's inputs (same resolved path or same
inode), and refuses a missing or read-only folder, so a mistake costs nothing.

An output produced row by row over a long run (``predict --csv ... --out``) goes through
``PartialFile``: the rows are appended, flushed and fsync'ed to ``<target>.partial`` beside the target,
which survives an interruption (so a later run can check it and go on), and ``finish`` renames it over
the target atomically, under the same rules as ``atomic_write``.

One writer at a time: ``hold_lock`` takes an exclusive lock on a small record file (flock(2) on the file
itself, released by the kernel however its holder ends, kill -9 included) and writes into it who holds it
(pid, command, start time); a second process is refused at once with ``BusyError`` naming the holder.  A
results folder (demos/common.py) and a ``predict --out`` output each have one.  ``check_folder`` checks
that a folder can hold new files (creating it) before any work.  ``exit_130_on_ctrl_c`` makes a Ctrl-C that
reaches the top of a command one line and exit status 130 instead of a traceback.

Standard library only.
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import stat
import sys
import tempfile
import time

__all__ = ["UnsafeOutputError", "atomic_write", "write_json", "check_output", "resolve_target", "PartialFile",
           "check_folder", "BusyError", "hold_lock", "release_lock", "describe_holder", "describe_record",
           "exit_130_on_ctrl_c"]

_UMASK = os.umask(0o022)
os.umask(_UMASK)


class UnsafeOutputError(ValueError):
    """An output path that must not be written: not a regular file, an input of the same command, or a
    folder that is missing or not writable.  ``.path`` is the path as given."""

    def __init__(self, path, why):
        self.path = os.fspath(path)
        super().__init__(f"refusing to write {self.path!r}: {why}; nothing was changed")


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def resolve_target(path):
    """The path that a write of ``path`` replaces: ``path`` itself, or the file a symbolic link points
    to.  Raises UnsafeOutputError when that is anything but a regular file or a missing name."""
    path = os.fspath(path)
    target = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UnsafeOutputError(path, f"it is a symbolic link to {target!r}, which does not exist") from None
        return target
    if not stat.S_ISREG(st.st_mode):
        what = _kind(st.st_mode)
        raise UnsafeOutputError(path, what if target == os.path.abspath(path) else
                                f"it is a symbolic link to {what} ({target!r})")
    return target


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(path, inputs=(), *, make_dirs=False):
    """Check, before any work, that ``path`` can be written without harm: a regular file or a missing
    name (symlinks followed), not one of ``inputs``, in a folder that exists (created when
    ``make_dirs``) and is writable.  Returns the resolved target; raises UnsafeOutputError."""
    target = resolve_target(path)
    for src in inputs:
        if src is not None and os.path.exists(src) and _same_file(target, src):
            raise UnsafeOutputError(path, f"it is this command's input {os.fspath(src)!r}")
    folder = os.path.dirname(target)
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    if not os.path.isdir(folder):
        raise UnsafeOutputError(path, f"its folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UnsafeOutputError(path, f"its folder {folder!r} is not writable")
    return target


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_temps(folder, name):
    """Remove ``.tmp-<pid>-*-<name>`` files in folder left by processes that no longer run."""
    for tmp in glob.glob(os.path.join(glob.escape(folder), f".tmp-*-{glob.escape(name)}")):
        pid = os.path.basename(tmp)[5:].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def atomic_write(path, data, *, make_dirs=True):
    """Write ``data`` (str or bytes) to ``path`` atomically and safely (see the module docstring).
    Missing folders are created unless ``make_dirs=False``.  Raises UnsafeOutputError when the target
    is not a regular file (or a link to one) or a missing name."""
    target = resolve_target(path)
    folder, name = os.path.split(target)
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    _remove_stale_temps(folder, name)
    binary = isinstance(data, (bytes, bytearray, memoryview))
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-", suffix="-" + name, dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)          # mkstemp makes 0600; give the file the usual mode
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        resolve_target(path)                    # the target may have changed kind while we wrote
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, obj, indent=1, **kw):
    """Serialise ``obj`` as JSON (NaN and infinity refused) and write it with ``atomic_write``."""
    atomic_write(path, json.dumps(obj, indent=indent, allow_nan=False) + "\n", **kw)


class PartialFile:
    """An output written in pieces that becomes ``path`` only when complete.

    Pieces (str, written as UTF-8) are appended to ``<target>.partial`` beside the file ``path`` resolves
    to; ``append`` flushes and fsyncs each, so after an interruption (Ctrl-C, SIGTERM, even ``kill -9``
    between two appends) the file holds every piece appended so far.  ``PartialFile(path, keep=n)`` opens
    an existing partial file and cuts it to its first ``n`` bytes (what a resumed run verified), else
    ``keep=None`` starts an empty one.  ``finish()`` renames it over the target atomically (refusing, as
    ``atomic_write`` does, a target that has meanwhile become anything but a regular file or a missing
    name); ``close()`` leaves it in place.  The partial file itself must be a regular file or missing
    (a symbolic link there is refused too).  Use as a context manager: leaving the block closes it."""

    def __init__(self, path, keep=None):
        self.path = os.fspath(path)
        self.target = resolve_target(path)
        self.partial = self.target + ".partial"
        partial_kind = os.lstat(self.partial).st_mode if os.path.lexists(self.partial) else None
        if partial_kind is not None and not stat.S_ISREG(partial_kind):
            what = "a symbolic link" if stat.S_ISLNK(partial_kind) else _kind(partial_kind)
            raise UnsafeOutputError(self.partial, what)
        if keep is None:
            fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        else:
            fd = os.open(self.partial, os.O_WRONLY | os.O_NOFOLLOW)
            os.ftruncate(fd, keep)
            os.lseek(fd, 0, os.SEEK_END)
        self._file = os.fdopen(fd, "wb", buffering=0)     # unbuffered: a failed append leaves nothing to flush
        self.size = self._file.tell()

    def append(self, text):
        """Append ``text`` and make it durable (fsync); returns the partial file's size in bytes.  The bytes go
        straight to the file (no buffer), so when a write fails (a full disk, a size limit) the error is
        raised here once, and ``close`` has nothing left to write and cannot raise it again."""
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[self._file.write(data):]           # a raw write may take fewer bytes than given
        os.fsync(self._file.fileno())
        self.size += len(data.obj)
        return self.size

    def finish(self):
        """Close and rename the partial file over the target (atomic); returns the target's path."""
        self.close()
        resolve_target(self.path)               # the target may have changed kind while we wrote
        os.replace(self.partial, self.target)
        return self.target

    def close(self):
        """Close the partial file and leave it where it is (a later run may resume it)."""
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ----------------------------------------------------------------------------- a folder that can hold new files

def check_folder(folder, *, make=True):
    """Check, before any work, that ``folder`` can hold new files: creates it (and its parents) when ``make``,
    then creates and removes a probe file in it.  Returns its absolute path; raises UnsafeOutputError naming
    the folder and what is wrong: a file where it or one of its parents should be, a folder that cannot be
    made, or one where no file can be created (read-only, no permission, full)."""
    folder = os.path.abspath(os.fspath(folder))
    parent = folder
    while parent != os.path.dirname(parent):
        if os.path.exists(parent) and not os.path.isdir(parent):
            why = "it is a file, not a folder" if parent == folder else f"{parent!r} above it is a file, not a folder"
            raise UnsafeOutputError(folder, why)
        parent = os.path.dirname(parent)
    if make:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise UnsafeOutputError(folder, f"the folder cannot be created ({e.strerror or e})") from None
    if not os.path.isdir(folder):
        raise UnsafeOutputError(folder, "the folder does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".tmp-{os.getpid()}-", suffix="-probe", dir=folder)
    except OSError as e:
        raise UnsafeOutputError(folder, f"no file can be created in it ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)
    return folder


# ----------------------------------------------------------------------------- one writer at a time

class BusyError(RuntimeError):
    """Another live process holds the lock; ``.holder`` names it (pid, command, start time)."""

    def __init__(self, path, holder):
        self.path, self.holder = os.fspath(path), holder
        super().__init__(f"{self.path} is held by {holder}")


def _read_record(fd_or_path):
    """The JSON object in a lock record (an open descriptor or a path), or None when it is empty or unreadable."""
    try:
        if isinstance(fd_or_path, int):
            data = os.pread(fd_or_path, 1 << 16, 0)
        else:
            with open(fd_or_path, "rb") as f:
                data = f.read(1 << 16)
        record = json.loads(data.decode("utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "pid" in record else None


def describe_record(record):
    """A lock record as 'pid N (command, started T)'."""
    command = record.get("command")
    command = " ".join(map(str, command)) if isinstance(command, list) else str(command)
    return f"pid {record['pid']} ({command}, started {record.get('started_utc')})"


def describe_holder(path, wait=2.0):
    """'pid N (command, started T)' from the lock record ``path``, waiting up to ``wait`` seconds for a holder
    that has just taken the lock to write it."""
    deadline = time.monotonic() + wait
    while True:
        record = _read_record(path)
        if record is not None:
            return describe_record(record)
        if time.monotonic() >= deadline:
            return "another process (its record is not written yet)"
        time.sleep(0.02)


def _open_locked(path, fcntl):
    """A descriptor of ``path`` holding its exclusive flock, the file still at ``path`` (a holder that was
    removing it as we opened it is retried); BusyError when a live process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BusyError(path, describe_holder(path)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            here = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev):
            return fd
        os.close(fd)                             # its holder removed it after we opened it: take the new one


def hold_lock(path):
    """Take the lock record ``path`` for this process: (descriptor, the record found there or None).  The
    record found is that of a process that has ended (a live one still holds the lock: BusyError naming it);
    this process's record (pid, command, start time) replaces it.  The lock lasts until ``release_lock`` or
    this process ends (forked children share it).  (None, None) where flock is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        return None, None
    fd = _open_locked(os.fspath(path), fcntl)
    previous = _read_record(fd)
    record = {"pid": os.getpid(), "command": [sys.executable, *sys.argv],
              "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    data = (json.dumps(record) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    return fd, previous


def release_lock(path, fd):
    """Remove the lock record ``path`` (if it is still this descriptor's file) and release the lock."""
    if fd is None:
        return
    try:
        here, mine = os.stat(path, follow_symlinks=False), os.fstat(fd)
        if (here.st_ino, here.st_dev) == (mine.st_ino, mine.st_dev):
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- Ctrl-C at the top of a command

def exit_130_on_ctrl_c(message):
    """Install a ``sys.excepthook`` under which a KeyboardInterrupt that reaches the top of the program (a
    Ctrl-C while it imports, say) prints ``message`` on stderr and ends the process with status 130, after
    what a normal exit runs (atexit: multiprocessing stops its workers), instead of a traceback.  Any other
    exception goes to the previous hook unchanged."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, KeyboardInterrupt):
            return previous(kind, value, tb)
        print(message, file=sys.stderr, flush=True)
        import atexit
        atexit._run_exitfuncs()
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os._exit(130)
    sys.excepthook = hook
