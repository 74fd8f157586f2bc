"""Tests that nothing a user types destroys a file, leaves a process behind, or gives a quiet wrong answer
(transformer.py): train's argument and sample checks, a non-finite step, damaged checkpoints, oversized
model files and configs, beam search's argument checks, forked workers that die with their parent, and
SIGTERM during train.  The torch_bridge command line is tested in tests/tests_torch_bridge.py, the one-run-per-
results-folder lock in tests/tests_commands.py.

Run either way:
    python tests/tests_robustness.py         # zero third-party imports; one line per test
    python -m pytest tests/tests_robustness.py

The process tests start a child Python, let it fork its workers, kill it, and look the workers up in
/proc (Linux); elsewhere they are skipped.
"""
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

import transformer as core  # noqa: E402  (imported after the sys.path set-up above)
from tests_transformer import _raises  # noqa: E402  (call fn(), return the exception it must raise)

# ----------------------------------------------------------------------------- helpers


def _lm(seed=1):
    return core.TransformerLM(5, 4, 2, 1, 6, seed=seed)


def _weights(model):
    return [json.dumps(p.data) for p in model.params()]


LM_DATA = [[1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2], [4, 1, 2, 3]]
QUIET = dict(workers=1, verbose=False)

# ----------------------------------------------------------------------------- train: arguments and samples


def t_train_names_a_bad_argument_before_any_work():
    """lr NaN / 0 / -1 (gradient ascent), clip NaN / 0, a negative weight decay, betas out of [0, 1) and a
    NaN warmup are each refused naming the argument and its value; the model is untouched."""
    bad = [(dict(lr=float("nan")), ValueError, "lr"), (dict(lr=-1), ValueError, "lr"), (dict(lr=0), ValueError, "lr"),
           (dict(lr="1e-3"), TypeError, "lr"), (dict(clip=float("nan")), ValueError, "clip"),
           (dict(clip=0.0), ValueError, "clip"), (dict(weight_decay=-0.1), ValueError, "weight_decay"),
           (dict(betas=(0.9, 1.0)), ValueError, "betas[1] must be a finite number in [0, 1), got 1.0"),
           (dict(betas=0.9), TypeError, "betas"),
           (dict(warmup=float("nan")), ValueError, "warmup"), (dict(lr=True), TypeError, "lr")]
    for kwargs, exc, word in bad:
        model = _lm()
        before = _weights(model)
        e = _raises(exc, lambda: core.train(model, LM_DATA, core.lm_loss, epochs=1, batch_size=2, **QUIET, **kwargs))
        value = repr(next(iter(kwargs.values())))
        assert word in str(e) and (value in str(e) or "betas" in kwargs), (kwargs, str(e))
        assert _weights(model) == before, kwargs
    assert core.train(_lm(), LM_DATA, core.lm_loss, epochs=1, batch_size=2, clip=None, **QUIET)["n_steps"] == 2


def t_train_names_a_sample_its_loss_cannot_use():
    """A length-1 LM sequence, an empty source or a 1-token target of a seq2seq pair, and a NaN regression
    target are each refused at entry naming the sample's index and what is wrong (not 'got an empty
    sequence' deep inside the model, nor 'loss became nan at step 2')."""
    e = _raises(ValueError, lambda: core.train(_lm(), LM_DATA + [[3]], core.lm_loss, **QUIET))
    assert "train_data[4]" in str(e) and "1 token" in str(e) and "at least 2" in str(e), str(e)
    e = _raises(ValueError, lambda: core.train(_lm(), LM_DATA, core.lm_loss, valid_data=[[1, 2], []], **QUIET))
    assert "valid_data[1]" in str(e), str(e)
    s2s = core.EncoderDecoder(5, 5, 4, 2, 1, 6, seed=1)
    e = _raises(ValueError, lambda: core.train(s2s, [([1, 2], [1, 2, 3]), ([], [1, 2])], core.seq2seq_loss, **QUIET))
    assert "train_data[1]" in str(e) and "empty source" in str(e), str(e)
    e = _raises(ValueError, lambda: core.train(s2s, [([1, 2], [1])], core.seq2seq_loss, **QUIET))
    assert "train_data[0]" in str(e) and "at least 2" in str(e), str(e)
    enc = core.TransformerEncoder(5, 4, 2, 1, 6, seed=1)
    before = _weights(enc)
    data = [([1, 2], 0.5), ([2, 3], float("nan")), ([3, 1], 1.0)]
    e = _raises(ValueError, lambda: core.train(enc, data, core.regression_loss, batch_size=3, **QUIET))
    assert "train_data[1]" in str(e) and "nan" in str(e) and "target" in str(e), str(e)
    assert _weights(enc) == before


class _NanAt:
    """lm_loss, but NaN for sample ``bad`` from the ``after``-th call on (a loss that goes bad mid-run), or
    with ``grad=True`` a finite loss whose gradient is infinite."""

    def __init__(self, bad, after, grad=False):
        self.bad, self.after, self.grad, self.calls = bad, after, grad, 0
        self.__qualname__ = "lm_loss_nan"

    def __call__(self, model, sample, backward=True):
        self.calls += 1
        loss = core.lm_loss(model, sample, backward=backward)
        if sample == LM_DATA[self.bad] and self.calls > self.after:
            if not self.grad:
                return float("nan")
            if backward:
                model.params()[0].grad[0][0] = float("inf")
        return loss


def t_a_non_finite_loss_names_step_and_sample_and_keeps_the_last_good_weights():
    """A loss that becomes NaN for one sample mid-run raises NonFiniteLossError naming the step and that
    sample; the weights are exactly those of the same run stopped one step earlier (nothing was updated
    with the NaN).  An infinite gradient with a finite loss is refused the same way (it used to be applied:
    clipping scaled it by 0 and Adam turned 0 * inf into NaN weights)."""
    kw = dict(epochs=4, batch_size=2, lr=1e-2, warmup=1, seed=3, **QUIET)
    for grad in (False, True):
        model = _lm()
        e = _raises(core.NonFiniteLossError, lambda: core.train(model, LM_DATA, _NanAt(2, after=4, grad=grad), **kw))
        assert isinstance(e, FloatingPointError) and e.step >= 3 and f"step {e.step}:" in str(e), str(e)
        ref = _lm()
        core.train(ref, LM_DATA, core.lm_loss, max_steps=e.step - 1, **kw)
        if not grad:
            assert e.samples == [2] and "train_data[2]" in str(e), str(e)
        else:
            assert "gradient" in str(e), str(e)
        assert _weights(model) == _weights(ref), grad
        assert all(math.isfinite(x) for p in model.params() for r in p.rows() for x in r)


def t_an_update_that_overflows_is_undone():
    """train's guard around Adam.step: when an update leaves a weight that is not finite, the weights and
    Adam's t, m and v are put back as they were before it, and NonFiniteLossError names the step."""
    model = _lm()
    opt = core.Adam(model.params(), lr=1e-2)
    for p in model.params():
        for r in p.rows("grad"):
            r[:] = [0.5] * len(r)
    opt.step()
    before = (_weights(model), json.dumps(opt.m), json.dumps(opt.v), opt.t)
    undo = core._UpdateUndo(opt)
    opt.step(lr=1e308)                                        # a finite lr whose update overflows ...
    model.params()[0].data[0][0] = float("inf")               # ... (made certain here)
    e = _raises(core.NonFiniteLossError, lambda: undo.check(7, "t"))
    assert "step 7" in str(e) and "undone" in str(e)
    assert (_weights(model), json.dumps(opt.m), json.dumps(opt.v), opt.t) == before
    undo = core._UpdateUndo(opt)
    opt.step()
    undo.check(8, "t")                                        # a finite update is kept
    assert opt.t == before[3] + 1 and _weights(model) != before[0]


def t_an_interrupt_in_the_middle_of_an_update_undoes_the_step_and_saves():
    """Ctrl-C (or SIGTERM) landing after Adam has changed the weights but before the step is recorded: the
    step is undone whole (weights, Adam, position, history) and the checkpoint of the steps before it is
    saved (it used to save nothing: with no earlier save there was no checkpoint at all); the same call
    then resumes to the uninterrupted run's weights, bit for bit."""
    data = [[1, 2, 3, 4, (i % 4) + 1] for i in range(12)]
    kw = dict(epochs=2, batch_size=2, lr=1e-2, warmup=2, seed=4, **QUIET)
    ref = _lm()
    core.train(ref, data, core.lm_loss, **kw)
    real, calls = core.Adam.step, {"n": 0}

    def step_then_interrupt(self, *args, **kwargs):
        real(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.json")
        core.Adam.step = step_then_interrupt
        try:
            _raises(KeyboardInterrupt,
                    lambda: core.train(_lm(), data, core.lm_loss, checkpoint=ck, checkpoint_every=1e9, **kw))
        finally:
            core.Adam.step = real
        with open(ck, encoding="utf-8") as f:
            saved = json.load(f)
        assert saved["progress"]["step"] == saved["adam"]["t"] == len(saved["history"]["steps"]) == 2
        resumed = _lm()
        assert core.train(resumed, data, core.lm_loss, checkpoint=ck, **kw)["resumed_at_steps"] == [2]
        assert _weights(resumed) == _weights(ref)


# ----------------------------------------------------------------------------- damaged checkpoints


def _checkpoint(d):
    """(train with checkpoint=path as a function of a model, path, the finished run's checkpoint)."""
    path = os.path.join(d, "ck.json")

    def run(model):
        return core.train(model, LM_DATA[:3], core.lm_loss, epochs=2, batch_size=2, max_steps=3, checkpoint=path,
                        **QUIET)
    run(_lm())
    with open(path, encoding="utf-8") as f:
        return run, path, json.load(f)


def _with(obj, dotted, value):
    """A deep copy of obj with the field at ``dotted`` (a.b.c) set to value."""
    obj = json.loads(json.dumps(obj))
    *head, last = dotted.split(".")
    node = obj
    for k in head:
        node = node[k]
    node[last] = value
    return obj


def t_every_checkpoint_field_the_loader_reads_is_checked_before_anything_changes():
    """A negative Adam v (it used to fail as 'math domain error' after loading), a NaN or string ep_loss
    (it used to fail at the next save), history.steps of None (accepted), a NaN step loss, an epoch record
    of the wrong type, a float Adam t, an order of floats and an out-of-range ep_batches each raise
    CheckpointMismatchError naming the field; the model, Adam's state and the RNG are untouched."""
    with tempfile.TemporaryDirectory() as d:
        run, path, good = _checkpoint(d)
        v = json.loads(json.dumps(good["adam"]["v"]))
        v[0][0][0] = -1e-3
        cases = [(_with(good, "adam.v", v), "adam.v"), (_with(good, "progress.ep_loss", float("nan")), "ep_loss"),
                 (_with(good, "progress.ep_loss", "x"), "ep_loss"),
                 (_with(good, "history.steps", [None] * 3), "history.steps[0]"),
                 (_with(good, "history.steps", [dict(s, loss=float("nan")) for s in good["history"]["steps"]]),
                  "history.steps[0]"),
                 (_with(good, "history.epochs", [5] + good["history"]["epochs"][1:]), "history.epochs[0]"),
                 (_with(good, "adam.t", 3.0), "adam.t"),
                 (_with(good, "progress.order", [0.0, 1.0, 2.0]), "progress.order"),
                 (_with(good, "progress.ep_batches", 99), "progress.ep_batches"),
                 (_with(good, "history.resumed_at_steps", ["x"]), "resumed_at_steps")]
        for obj, field in cases:
            with open(path, "w", encoding="utf-8") as f:
                f.write(json.dumps(obj))
            model = _lm()
            model.params()[0].data[0][0] = 0.5                  # to see that nothing is loaded
            before = _weights(model)
            e = _raises(core.CheckpointMismatchError, lambda: run(model))
            assert field in str(e) and path in str(e), (field, str(e))
            assert _weights(model) == before, field
            opt, rng = core.Adam(model.params()), random.Random(5)
            state = (json.dumps(opt.m), json.dumps(opt.v), opt.t, rng.getstate())
            fp = good["fingerprint"]
            _raises(core.CheckpointMismatchError, lambda: core._load_checkpoint(path, fp, model, opt, rng, {
                "total_steps": 3, "n": 3, "epochs": 2, "batch_size": 2}))
            assert (json.dumps(opt.m), json.dumps(opt.v), opt.t, rng.getstate()) == state, field
            assert _weights(model) == before, field
        with open(path, "w", encoding="utf-8") as f:             # the intact file still resumes
            json.dump(good, f)
        assert run(_lm())["n_steps"] == 3


def t_a_dead_writers_checkpoint_temp_file_is_removed_by_the_next_save():
    """kill -9 during a checkpoint write leaves .tmp-<pid>-*-ck.json beside it; the next checkpoint save of
    the same file (through safe_io.atomic_write) removes the temp files of processes that no longer run."""
    with tempfile.TemporaryDirectory() as d:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        stale = os.path.join(d, f".tmp-{dead.pid}-abc123-ck.json")
        with open(stale, "w") as f:
            f.write("{half a checkpoint")
        core.train(_lm(), LM_DATA, core.lm_loss, epochs=1, batch_size=2, checkpoint=os.path.join(d, "ck.json"), **QUIET)
        assert sorted(os.listdir(d)) == ["ck.json"], os.listdir(d)


# ----------------------------------------------------------------------------- model files


def t_load_model_refuses_a_huge_file_before_reading_it_and_a_huge_config_before_allocating():
    """A 1 GB sparse file is refused at once (it used to be read whole: 2.1 GB of memory), the limit stated;
    d_model = 1e9 (a float) names the field; an int d_model of a million states the parameter count and
    the limit; both without allocating (well under a second)."""
    with tempfile.TemporaryDirectory() as d:
        big = os.path.join(d, "big.json")
        with open(big, "wb") as f:
            f.truncate(2 ** 30)
        t0 = time.perf_counter()
        e = _raises(core.ModelFormatError, lambda: core.load_model(big))
        assert big in str(e) and f"{core.MAX_MODEL_FILE_MB} MB" in str(e) and time.perf_counter() - t0 < 1.0, str(e)
        path = os.path.join(d, "m.json")
        core.save_model(_lm(), path)
        with open(path, encoding="utf-8") as f:
            good = json.load(f)
        for value, words in ((1e9, ["d_model", "1000000000.0"]),
                             (10 ** 6, [f"{core.MAX_MODEL_PARAMS:,}", "parameters"]),
                             (0, ["d_model", "0"]), (True, ["d_model"])):
            with open(path, "w", encoding="utf-8") as f:
                json.dump(dict(good, config=dict(good["config"], d_model=value)), f)
            t0 = time.perf_counter()
            e = _raises(core.ModelFormatError, lambda: core.load_model(path))
            assert all(w in str(e) for w in words) and path in str(e), (value, str(e))
            assert time.perf_counter() - t0 < 1.0, value
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(good, config=dict(good["config"], bogus=1)), f)
        assert "bogus" in str(_raises(core.ModelFormatError, lambda: core.load_model(path)))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(good, f)
        assert core.load_model(path).config == good["config"]
        assert "limit" in str(_raises(core.ModelFormatError, lambda: core.load_model(path, max_params=10)))


# ----------------------------------------------------------------------------- beam search


def t_beam_search_checks_its_arguments_as_generate_does():
    """max_new_tokens -5 (it returned [([], 0.0, 0.0)]), width 2.5 (a bare slice TypeError), width 0 or True,
    a NaN length_penalty (all-NaN scores), a constraint answering id 99 (a bare IndexError) and an
    EncoderDecoder with src=[] ('max() arg is an empty sequence') are each a named error with the value."""
    lm = _lm()
    bad = [(dict(max_new_tokens=-5), ValueError, "-5"), (dict(width=2.5), TypeError, "width"),
           (dict(width=0), ValueError, "width"), (dict(width=True), TypeError, "width"),
           (dict(length_penalty=float("nan")), ValueError, "length_penalty"),
           (dict(length_penalty="1"), TypeError, "length_penalty"),
           (dict(constraint=lambda t: [1, 99]), core.ConstraintError, "99"),
           (dict(constraint=lambda t: [1.5]), core.ConstraintError, "1.5"), (dict(prefix=[]), ValueError, "prefix")]
    for kwargs, exc, word in bad:
        args = {"prefix": [1], "width": 2, "max_new_tokens": 3, **kwargs}
        e = _raises(exc, lambda: core.beam_search(lm, args.pop("prefix"), args.pop("width"), args.pop("max_new_tokens"),
                                                **args))
        assert word in str(e), (kwargs, str(e))
    e = _raises(core.ConstraintError, lambda: core.generate(lm, [1], 3, constraint=lambda t: [99]))
    assert e.token_id == 99 and isinstance(e, ValueError) and "0..4" in str(e)
    s2s = core.EncoderDecoder(5, 5, 4, 2, 1, 6, seed=1)
    for fn in (lambda: core.beam_search(s2s, [1], 2, 3, src=[]), lambda: core.generate(s2s, [1], 3, src=[]),
               lambda: core.start_decode(s2s, [1], src=[])):
        assert "non-empty src" in str(_raises(ValueError, fn))
    assert len(core.beam_search(lm, [1], 2, 3, length_penalty=0)) == 2        # valid arguments still work


# ----------------------------------------------------------------------------- processes


def _procs_linux():
    if not os.path.isdir("/proc/self"):
        raise unittest.SkipTest("needs /proc (Linux) to find the worker processes")


def _children(pid):
    """The pids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _alive(pid):
    """True for a running process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_TRAIN_FOREVER = """
import sys; sys.path.insert(0, {here!r})
import transformer as core
core._USE_PDEATHSIG = {pdeathsig}
data = [[1, 2, 3, 4, 1, 2, 3, 4]] * 64
print("start", flush=True)
core.train(core.TransformerLM(5, 8, 2, 1, 16, seed=1), data, core.lm_loss, epochs=10 ** 6, batch_size=8, workers=2,
         verbose=False)
"""

_MAP_FOREVER = """
import sys, time; sys.path.insert(0, {here!r})
import transformer as core
core._USE_PDEATHSIG = {pdeathsig}
print("start", flush=True)
core.parallel_map(lambda x, rng: time.sleep(0.05), range(10 ** 5), workers=2)
"""


def _kill_parent_and_count_survivors(code, n_workers):
    """Start ``code`` in a child Python, wait until it has forked n_workers workers, kill -9 the child and
    return its workers still alive 2 s later (then kills those, so that a failing test leaves none)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    workers = []
    try:
        assert proc.stdout.readline().strip() == b"start", proc.stderr.read()
        t0 = time.time()
        while len(workers) < n_workers and time.time() - t0 < 60:
            time.sleep(0.1)
            workers = [p for p in _children(proc.pid) if _alive(p)]
        assert len(workers) >= n_workers, workers
        time.sleep(0.3)                                         # the workers are busy
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(2.0)
        return [p for p in workers if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in workers + _children(proc.pid):
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass


def t_data_parallel_workers_die_with_their_killed_parent():
    """kill -9 of a train(workers=2) process: its worker is gone 2 s later, with the kernel's parent-death
    signal (Linux) and without it (the worker sees end-of-file on its pipe: it holds no copy of the
    parent's end).  It used to sleep forever in recv() with PPID 1."""
    _procs_linux()
    for pdeathsig in (True, False):
        left = _kill_parent_and_count_survivors(_TRAIN_FOREVER.format(here=HERE, pdeathsig=pdeathsig), 1)
        assert left == [], (pdeathsig, left)


def t_parallel_map_workers_die_with_their_killed_parent():
    """The same for parallel_map's two workers, with and without the parent-death signal (without it a
    worker notices that its parent changed, or that its pipe broke, after the item it is on)."""
    _procs_linux()
    for pdeathsig in (True, False):
        left = _kill_parent_and_count_survivors(_MAP_FOREVER.format(here=HERE, pdeathsig=pdeathsig), 2)
        assert left == [], (pdeathsig, left)


_TRAIN_UNTIL_TERM = """
import sys; sys.path.insert(0, {here!r})
import transformer as core
data = [[1, 2, 3, 4, 1, 2, 3, 4]] * 2000
try:
    core.train(core.TransformerLM(5, 8, 2, 1, 16, seed=1), data, core.lm_loss, epochs=1, batch_size=1, \
workers={workers},
             log_every=1, checkpoint={ck!r}, checkpoint_every=1e9, tag="t")
except KeyboardInterrupt:
    sys.exit(130)
"""


def t_sigterm_during_train_saves_the_checkpoint_and_stops_as_ctrl_c_does():
    """SIGTERM to the process group of a checkpointed train (one process, and with a worker) saves the
    checkpoint where the run stands and stops as Ctrl-C does, KeyboardInterrupt and its message (it used
    to die at once and save nothing)."""
    if not hasattr(os, "killpg"):
        raise unittest.SkipTest("needs process groups")
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            ck = os.path.join(d, "ck.json")
            code = _TRAIN_UNTIL_TERM.format(here=HERE, workers=workers, ck=ck)
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if "step 3/" in line:
                    break
            os.killpg(proc.pid, signal.SIGTERM)
            out = "".join(lines) + proc.stdout.read()
            assert proc.wait(timeout=60) == 130, out
            assert "interrupted at step" in out and "run the same command again" in out, out
            with open(ck, encoding="utf-8") as f:
                saved = json.load(f)
            step = saved["progress"]["step"]
            assert step >= 3 and len(saved["history"]["steps"]) == step, (workers, step)
            assert f"interrupted at step {step}/" in out, out


if __name__ == "__main__":
    from tests_transformer import main
    raise SystemExit(main(globals()))
