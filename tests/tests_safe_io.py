"""The one file writer (safe_io.py): atomic, never replaces what is not a regular file, never writes
onto a command's own input.  Every special file here is made in a temp folder, never the system's /dev.

    python -m pytest tests/tests_safe_io.py
"""
import os
import socket
import stat
import subprocess
import sys

import pytest

import safe_io


def _device_or_socket(folder):
    """A character device node like /dev/full (1, 7), made here; where mknod is not permitted, a UNIX
    socket file, the other kind of special file an ordinary user can make."""
    path = os.path.join(folder, "full")
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 7))
        return path, stat.S_ISCHR
    except PermissionError:
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
        return path, stat.S_ISSOCK


def t_atomic_write_refuses_a_device_node_and_leaves_it(tmp_path):
    path, is_kind = _device_or_socket(str(tmp_path))
    with pytest.raises(safe_io.UnsafeOutputError) as e:
        safe_io.atomic_write(path, "x")
    assert path in str(e.value) and e.value.path == path
    assert is_kind(os.lstat(path).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["full"]            # no temp file left behind


def t_atomic_write_refuses_a_fifo_and_a_directory(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for target in (fifo, folder):
        with pytest.raises(safe_io.UnsafeOutputError):
            safe_io.write_json(target, {"a": 1})
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir() and not list(folder.iterdir())
    assert sorted(os.listdir(tmp_path)) == ["folder", "pipe"]


def t_a_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    safe_io.atomic_write(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(safe_io.UnsafeOutputError):
        safe_io.atomic_write(dangling, "x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "to_fifo"
    to_fifo.symlink_to(fifo)
    with pytest.raises(safe_io.UnsafeOutputError):
        safe_io.atomic_write(to_fifo, "x")
    assert to_fifo.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def t_check_output_refuses_the_commands_own_input(tmp_path):
    src = tmp_path / "in.json"
    src.write_text("{}")
    with pytest.raises(safe_io.UnsafeOutputError, match="input"):
        safe_io.check_output(str(tmp_path / "." / "in.json"), inputs=[str(src)])
    hard = tmp_path / "hard.json"
    os.link(src, hard)                                     # another name, same inode
    with pytest.raises(safe_io.UnsafeOutputError, match="input"):
        safe_io.check_output(hard, inputs=[src])
    assert src.read_text() == "{}"
    assert safe_io.check_output(tmp_path / "out.json", inputs=[src]) == str(tmp_path / "out.json")


def t_check_output_refuses_a_missing_or_read_only_folder_before_any_work(tmp_path):
    with pytest.raises(safe_io.UnsafeOutputError, match="does not exist"):
        safe_io.check_output(tmp_path / "no" / "out.csv")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):                        # root may write anywhere: the check is moot
            assert safe_io.check_output(ro / "out.csv")
        else:
            with pytest.raises(safe_io.UnsafeOutputError, match="not writable"):
                safe_io.check_output(ro / "out.csv")
    finally:
        ro.chmod(0o700)


def t_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = tmp_path / f".tmp-{dead}-abc123-model.json"
    stale.write_text("half")
    mine = tmp_path / f".tmp-{os.getpid()}-zzz-model.json"   # a live process's temp file stays
    mine.write_text("busy")
    other = tmp_path / f".tmp-{dead}-abc123-other.json"      # another target's temp file stays
    other.write_text("half")
    safe_io.write_json(tmp_path / "model.json", {"ok": True})
    assert not stale.exists() and mine.exists() and other.exists()


def t_an_interrupted_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(ValueError):
        safe_io.write_json(path, {"x": float("nan")})        # refused before anything is written
    with pytest.raises(TypeError):
        safe_io.atomic_write(path, 12345)                    # fails inside the write: temp removed
    assert path.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["r.json"]


def t_partial_file_appends_durably_and_becomes_the_target_at_finish(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old")
    with safe_io.PartialFile(target) as out:
        assert out.append("a\n") == 2 and out.append("bé\n") == 6     # bytes, UTF-8
        assert (tmp_path / "out.csv.partial").read_bytes() == "a\nbé\n".encode() and target.read_text() == "old"
    assert (tmp_path / "out.csv.partial").exists() and target.read_text() == "old"   # closed, not finished
    out = safe_io.PartialFile(target, keep=2)                    # resume: keep the verified first 2 bytes
    out.append("c\n")
    assert out.finish() == str(target) and target.read_text() == "a\nc\n"
    assert sorted(os.listdir(tmp_path)) == ["out.csv"]
    link = tmp_path / "link.csv"                                 # a link is followed: the partial file
    link.symlink_to(target)                                      # sits beside the file it points to
    with safe_io.PartialFile(link) as out:
        out.append("x\n")
        out.finish()
    assert link.is_symlink() and target.read_text() == "x\n"


def t_partial_file_write_failure_is_raised_once_and_close_keeps_the_rows(tmp_path):
    """A write past a file size limit (ulimit -f, as a full disk) raises EFBIG from ``append``, once: ``close``
    has nothing buffered to write again (a buffered file re-raised it at close, and in predict --csv --out
    that second error replaced the message saying how to resume).  The pieces appended before it stay."""
    code = ("import resource, sys, safe_io\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))\n"
            "out = safe_io.PartialFile(sys.argv[1])\n"
            "out.append('a' * 1000)\n"
            "try:\n    out.append('b' * 700 + '\\n')\n    out.append('c' * 700 + '\\n')\n"
            "    out.append('d' * 700 + '\\n')\nexcept OSError as e:\n    print('append', e.errno)\n"
            "out.close()\nprint('closed', out.size)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.csv")], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["append", "27", "closed", "2402"], proc.stdout + proc.stderr
    kept = (tmp_path / "out.csv.partial").read_text(encoding="utf-8")
    assert kept.startswith("a" * 1000 + "b" * 700 + "\n" + "c" * 700 + "\n"), kept[:50]


def t_partial_file_refuses_special_files(tmp_path):
    fifo = tmp_path / "out.csv.partial"
    os.mkfifo(fifo)
    with pytest.raises(safe_io.UnsafeOutputError, match="FIFO"):
        safe_io.PartialFile(tmp_path / "out.csv")
    os.unlink(fifo)
    (tmp_path / "elsewhere").write_text("keep")
    fifo.symlink_to(tmp_path / "elsewhere")                      # a link where the partial file goes
    with pytest.raises(safe_io.UnsafeOutputError, match="symbolic link"):
        safe_io.PartialFile(tmp_path / "out.csv")
    assert (tmp_path / "elsewhere").read_text() == "keep"
    os.mkfifo(tmp_path / "pipe_target")                         # the target itself a FIFO: refused at once
    with pytest.raises(safe_io.UnsafeOutputError, match="FIFO"):
        safe_io.PartialFile(tmp_path / "pipe_target")
    assert not (tmp_path / "pipe_target.partial").exists()
    out = safe_io.PartialFile(tmp_path / "late.csv")
    out.append("row\n")
    os.mkfifo(tmp_path / "late.csv")                             # the target became a FIFO meanwhile
    with pytest.raises(safe_io.UnsafeOutputError):
        out.finish()
    assert stat.S_ISFIFO(os.lstat(tmp_path / "late.csv").st_mode) and (tmp_path / "late.csv.partial").exists()


# ----------------------------------------------------------------------------- one writer at a time

_HOLDER = """import os, sys, time, safe_io
fd, previous = safe_io.hold_lock(sys.argv[1])
print("held", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
if sys.argv[3] == "release":
    safe_io.release_lock(sys.argv[1], fd)
"""


def t_hold_lock_refuses_a_second_holder_naming_it_and_passes_to_the_next_when_it_ends(tmp_path):
    """hold_lock: while one process holds a lock record, another is refused at once with BusyError naming its
    pid and command; a holder killed (its record left behind) passes it on, the next one getting the dead
    holder's record; a holder that releases removes the record."""
    lock, stop = str(tmp_path / "out.lock"), str(tmp_path / "stop")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for ending in ("kill", "release"):
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, lock, stop, ending], cwd=root, text=True,
                                  stdout=subprocess.PIPE)
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(safe_io.BusyError) as e:
            safe_io.hold_lock(lock)
        assert f"pid {holder.pid}" in e.value.holder and ending in e.value.holder
        if ending == "kill":
            holder.kill()
        else:
            open(stop, "w").close()
        holder.wait(timeout=60)
        assert os.path.exists(lock) == (ending == "kill")
        fd, previous = safe_io.hold_lock(lock)
        assert (previous or {}).get("pid") == (holder.pid if ending == "kill" else None), previous
        safe_io.release_lock(lock, fd)
        assert not os.path.exists(lock)


def t_check_folder_names_what_is_wrong_and_creates_nothing_then(tmp_path):
    (tmp_path / "f").write_text("x")
    for folder, why in ((tmp_path / "f", "it is a file"), (tmp_path / "f" / "a" / "b", "above it is a file")):
        with pytest.raises(safe_io.UnsafeOutputError, match=why) as e:
            safe_io.check_folder(folder)
        assert str(folder) in str(e.value)
    assert safe_io.check_folder(tmp_path / "new" / "deep") == str(tmp_path / "new" / "deep")
    assert os.listdir(tmp_path / "new" / "deep") == [] and sorted(os.listdir(tmp_path)) == ["f", "new"]


# ----------------------------------------------------------------------------- every writer is this one

_MEMORY_RENDERERS = {"savefig": 0, "save": 1}     # fig.savefig(target, ...), torch.save(obj, target, ...)


def _direct_writes(source):
    """The lines of ``source`` that write a file other than through safe_io: open() with a mode that
    writes, os.replace/rename, os.fdopen, shutil copies, json/pickle.dump, Path.write_text/bytes, and a
    figure or torch object rendered to anything but an in-memory io.BytesIO() named in the same function."""
    import ast
    tree, out = ast.parse(source), []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
        buffers = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.value) == "io.BytesIO()"
                   for t in n.targets if isinstance(t, ast.Name)}
        for node in [n for n in ast.walk(fn) if isinstance(n, ast.Call)]:
            f, call = node.func, ast.unparse(node.func)
            if isinstance(f, ast.Name) and f.id == "open":
                mode = (node.args[1] if len(node.args) > 1
                        else next((k.value for k in node.keywords if k.arg == "mode"), None))
                if mode is not None and not (isinstance(mode, ast.Constant) and set(str(mode.value)) <= set("rbt")):
                    out.append(f"{node.lineno}: open(..., {ast.unparse(mode)})")
            elif call in ("os.replace", "os.rename", "os.fdopen", "shutil.copy", "shutil.copyfile", "shutil.copy2",
                          "shutil.move", "json.dump", "pickle.dump") or (isinstance(f, ast.Attribute) and f.attr in (
                              "write_text", "write_bytes")):
                out.append(f"{node.lineno}: {call}")
            elif isinstance(f, ast.Attribute) and (f.attr == "savefig" or call == "torch.save"):
                i = _MEMORY_RENDERERS[f.attr]
                target = node.args[i] if len(node.args) > i else None
                if not (isinstance(target, ast.Name) and target.id in buffers):
                    out.append(f"{node.lineno}: {call} to {ast.unparse(target) if target else '?'}")
    return sorted(set(out))


def t_every_file_the_project_writes_goes_through_safe_io(tmp_path):
    """Figures, results, models, checkpoints, predictions and torch exports: no module but safe_io.py opens a
    file for writing, renames one, or renders a figure or a torch object anywhere but into memory (then
    handed to safe_io.atomic_write), so a SIGTERM in make_figures can no longer leave a truncated SVG; the
    check itself catches each form; and a figure saved onto a FIFO is refused with the FIFO left as it was."""
    import glob
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert _direct_writes("import os\nos.replace('a', 'b')\n") == ["2: os.replace"]
    assert _direct_writes("def f(fig):\n    fig.savefig('x.svg')\n") == ["2: fig.savefig to 'x.svg'"]
    assert _direct_writes("def f(p):\n    with open(p, 'w') as f:\n        pass\n") == ["2: open(..., 'w')"]
    assert _direct_writes("import io\ndef f(fig):\n    buf = io.BytesIO()\n    fig.savefig(buf)\n") == []
    offenders = []
    for path in sorted(glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "demos", "*.py"))
                       + glob.glob(os.path.join(root, "tools", "*.py"))):
        name = os.path.basename(path)
        if name.startswith("tests_") or name in ("safe_io.py", "conftest.py"):
            continue
        with open(path, encoding="utf-8") as f:
            offenders += [f"{os.path.relpath(path, root)}:{x}" for x in _direct_writes(f.read())]
    assert not offenders, offenders
    sys.path.insert(0, os.path.join(root, "demos"))
    import report_kit
    pyplot = report_kit.plt()
    fig = pyplot.figure()
    os.mkfifo(tmp_path / "f.png")
    with pytest.raises(safe_io.UnsafeOutputError) as e:
        report_kit.save(fig, str(tmp_path), "f")
    assert "f.png" in str(e.value) and stat.S_ISFIFO(os.lstat(tmp_path / "f.png").st_mode)
    pyplot.close(fig)
