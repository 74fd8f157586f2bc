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

Standard library only.
"""
from __future__ import annotations

import glob
import json
import os
import stat
import tempfile

__all__ = ["UnsafeOutputError", "atomic_write", "write_json", "check_output", "resolve_target"]

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
