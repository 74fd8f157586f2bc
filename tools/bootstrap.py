"""Set-up for `make test` and `make run`: a project-local virtual environment with every extra, and the data.

    python3.11 tools/bootstrap.py venv     # create .venv (if there is none) and install into it (if needed)
    .venv/bin/python tools/bootstrap.py data   # make sure every data file is there, or say how to get it
    .venv/bin/python tools/bootstrap.py record build/tests   # make test's counts -> figures/, README block
    .venv/bin/python tools/bootstrap.py extra notebook       # one more extra (make notebook)

Standard library only (it runs before anything is installed).  The steps, in the order that works:

venv   ``.venv`` is created with the interpreter running this script (Python 3.11: DeepChem 2.8 needs
       < 3.12) unless it exists.  Then pip installs, each step quietly: torch==2.13.0 first (on this
       project's machines a local CPU wheel; an unpinned torch would pull a multi-GB CUDA build), the
       extras ``.[chem,test]``, guacamol 0.5.5 without its dependencies (it asks for rdkit-pypi, a second
       RDKit), then ``.[distribution]``.  A stamp file in .venv records the sha256 of pyproject.toml and of
       these steps; while it matches, nothing is installed again.  pip's output is shown when a step fails;
       on success only lines that are not known noise are (NOISE: pip's resolver complaint about the
       dependencies guacamol was installed without, and the notes of a machine whose pip configuration
       names index folders that lack some packages).
data   The data folder is, in this order: ``$CHEMDATA_DIR`` if set (it must be complete); else ``data/``
       if ``chemdata.check_data_files()`` finds every file; else the offline copies beside the checkout
       (``$CHEM_SHARED_DATA`` or ``../shared/data``) are COPIED into ``data/`` (the files whose sha256
       matches; the USPTO sub-folder kept); else ``python chemdata.py fetch`` downloads them (not with
       CHEMDATA_OFFLINE=1).  If files are still missing it stops with one message naming them and the
       three ways to provide them.
record ``make test`` runs pytest twice with ``--record-tests`` (conftest.py) into a scratch folder; this
       copies the two files (passed or not: they hold the failure counts too) to figures/tests_fast.json and
       figures/tests_slow.json and regenerates the README's generated blocks (``make_figures.py --readme
       --no-plots``), whose "tests" block shows them.
"""
import hashlib
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import chemdata  # noqa: E402  (standard library at import)
import safe_io  # noqa: E402  (imported after the sys.path set-up above)

PIP_STEPS = [
    ("torch 2.13.0, first (a local CPU wheel here)", ["torch==2.13.0"]),
    ("the chem and test extras (RDKit, DeepChem, matplotlib, pytest, nbclient)", ["-e", ".[chem,test]"]),
    ("guacamol 0.5.5 without its dependencies", ["--no-deps", "guacamol==0.5.5"]),
    ("the distribution extra (fcd and guacamol's own needs)", ["-e", ".[distribution]"]),
]
STAMP = ".chem-transformer-installed"
# pip output that is not about this project, dropped when the step succeeded (a failure shows everything).
NOISE = [
    # this machine's pip configuration lists local index folders; pip notes every package they lack
    re.compile(r"^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$"),
    # pip's resolver, after guacamol was installed with --no-deps (on purpose, see above)
    re.compile(r"^ERROR: pip's dependency resolver does not currently take into account all the packages"),
    re.compile(r"^guacamol 0\.5\.5 requires [^,]+, which is not installed\.$"),
]
DEEPCHEM_PYTHON = (3, 11)


def say(msg):
    print(f"[setup] {msg}", flush=True)


def venv_python(venv):
    return os.path.join(venv, "Scripts" if os.name == "nt" else "bin", "python")


def ensure_venv(venv):
    """Create ``venv`` with this interpreter unless it exists; refuse an interpreter DeepChem cannot use."""
    py = venv_python(venv)
    if not os.path.exists(py):
        if sys.version_info[:2] != DEEPCHEM_PYTHON:
            sys.exit(f"[setup] {sys.executable} is Python {sys.version.split()[0]}; the chemistry extras need "
                     f"Python 3.11 (DeepChem 2.8): run  make PYTHON=/path/to/python3.11")
        say(f"creating {os.path.relpath(venv, ROOT)} with Python {sys.version.split()[0]} ({sys.executable})")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    return py


def install_key():
    """sha256 of pyproject.toml and PIP_STEPS: the stamp that says the venv holds what they ask for."""
    h = hashlib.sha256()
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        h.update(f.read())
    h.update(repr(PIP_STEPS).encode())
    return h.hexdigest()


def not_noise(lines):
    """The lines of a successful pip run that are worth showing (NOISE dropped)."""
    return [x for x in lines if x.strip() and not any(p.search(x) for p in NOISE)]


def pip_step(py, i, what, args, total=len(PIP_STEPS)):
    """One quiet pip install; its whole output and exit 1 on failure, else the lines that are not NOISE."""
    say(f"{i}/{total} installing {what} ...")
    t0 = time.perf_counter()
    proc = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        print("\n".join(lines), flush=True)
        sys.exit(f"[setup] pip install {' '.join(args)} failed (exit {proc.returncode}); its output is above")
    for line in not_noise(lines):
        print(line, flush=True)
    say(f"{i}/{total} done in {time.perf_counter() - t0:.0f} s")


def cmd_venv(venv):
    """Create the venv if needed and install into it unless its stamp matches."""
    py = ensure_venv(venv)
    stamp, key = os.path.join(venv, STAMP), install_key()
    if os.path.exists(stamp) and open(stamp, encoding="utf-8").read().strip() == key:
        say(f"{os.path.relpath(venv, ROOT)} is up to date (pyproject.toml unchanged since its install)")
        return 0
    for i, (what, args) in enumerate(PIP_STEPS, 1):
        pip_step(py, i, what, args)
    safe_io.atomic_write(stamp, key + "\n")
    say(f"{os.path.relpath(venv, ROOT)} ready")
    return 0


def missing_in(folder):
    """The DATA_FILES names that are absent from folder or have another sha256."""
    return [name for name, entry in chemdata.DATA_FILES.items()
            if not os.path.isfile(os.path.join(folder, name))
            or chemdata.sha256_of(os.path.join(folder, name)) != entry["sha256"]]


def shared_folders():
    """Where this project's machines keep the offline copies: $CHEM_SHARED_DATA, ../shared/data."""
    return [f for f in (os.environ.get("CHEM_SHARED_DATA"), os.path.join(ROOT, "..", "shared", "data")) if f]


def copy_from(src, dest, names):
    """Copy the named files whose sha256 is right from src into dest (through safe_io); returns how many."""
    n = 0
    for name in names:
        path = os.path.join(src, name)
        if os.path.isfile(path) and chemdata.sha256_of(path) == chemdata.DATA_FILES[name]["sha256"]:
            with open(path, "rb") as f:
                safe_io.atomic_write(os.path.join(dest, name), f.read())
            n += 1
    return n


def fetch():
    """python chemdata.py fetch, unless CHEMDATA_OFFLINE=1; its output is shown."""
    if not chemdata.downloads_enabled():
        say("CHEMDATA_OFFLINE=1: not downloading")
        return
    say("downloading the missing files: python chemdata.py fetch")
    subprocess.run([sys.executable, os.path.join(ROOT, "chemdata.py"), "fetch"], cwd=ROOT, check=False)


def how_to_provide(missing, where):
    """The one message of a set-up that found no complete data folder."""
    return (f"[setup] {len(missing)} data file(s) missing from {where}: {', '.join(missing)}.\n"
            "Provide them in one of three ways, then run the same make command again:\n"
            "  1. export CHEMDATA_DIR=/a/folder/holding/them   (every reader of the data uses it)\n"
            "  2. copy them into data/, keeping the uspto50k_liu2017_original/ sub-folder\n"
            "     (e.g. cp -r ../shared/data/. data/ on this project's machines)\n"
            "  3. python chemdata.py fetch   (downloads them; needs the network)\n"
            "data/README.md lists every file, its source and its sha256.")


def cmd_data():
    """Find a complete data folder (see the module docstring); 0, or 1 after the one message."""
    n = len(chemdata.DATA_FILES)
    if os.environ.get("CHEMDATA_DIR"):
        missing = missing_in(chemdata.data_dir())
        if missing:
            print(how_to_provide(missing, f"CHEMDATA_DIR={chemdata.data_dir()}"), file=sys.stderr)
            return 1
        say(f"data: all {n} files in CHEMDATA_DIR={chemdata.data_dir()}")
        return 0
    folder = chemdata.data_dir()
    missing = missing_in(folder)
    for src in shared_folders():
        if missing and os.path.isdir(src):
            copied = copy_from(src, folder, missing)
            say(f"data: copied {copied} file(s) from {os.path.normpath(src)} into data/")
            missing = missing_in(folder)
    if missing:
        fetch()
        missing = missing_in(folder)
    if missing:
        print(how_to_provide(missing, "data/"), file=sys.stderr)
        return 1
    say(f"data: all {n} files in data/ (sha256 checked)")
    return 0


def cmd_record(scratch):
    """Copy make test's two records into figures/ and regenerate the README's generated blocks; 1 when a
    record is missing (its pytest run did not get as far as its summary)."""
    for kind in ("fast", "slow"):
        path = os.path.join(scratch, f"tests_{kind}.json")
        if not os.path.exists(path):
            print(f"[setup] no {path}: the README's tests block is left as it was", file=sys.stderr)
            return 1
    for kind in ("fast", "slow"):
        with open(os.path.join(scratch, f"tests_{kind}.json"), "rb") as f:
            safe_io.atomic_write(os.path.join(ROOT, "figures", f"tests_{kind}.json"), f.read())
    return subprocess.run([sys.executable, os.path.join(ROOT, "make_figures.py"), "--readme", "--no-plots"],
                          cwd=ROOT).returncode


def cmd_extra(name):
    """Install one more extra of pyproject.toml (``notebook``) into the running venv, as quietly."""
    pip_step(sys.executable, 1, f"the {name} extra", ["-e", f".[{name}]"], total=1)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("venv", "data", "record", "extra"):
        print(__doc__)
        return 2
    if argv[0] == "venv":
        return cmd_venv(os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(ROOT, ".venv")))
    if argv[0] == "extra":
        return cmd_extra(argv[1])
    if argv[0] == "data":
        return cmd_data()
    return cmd_record(argv[1] if len(argv) > 1 else os.path.join(ROOT, "build", "tests"))


if __name__ == "__main__":
    sys.exit(main())
