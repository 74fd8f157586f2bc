"""Predicting files, and the ``predict`` command: ``predictor.Predictor`` run over a CSV file of any size.

    1. files        one pipeline: read (a stream, binary files refused) -> dedupe -> predict in parallel
                    (predict_chunks) -> stream out in input order to <out>.partial, resumable after an
                    interruption (predict_csv: seven new columns per row); Ctrl-C and SIGTERM keep every
                    finished row (PredictInterrupted), so does a failed write (PredictWriteError); one
                    run per output (<out>.lock); --resume checks the rows' recorded sha256
    2. the command  ``chem-transformer-predict MODEL INPUT... | MODEL --csv FILE [--out F [--resume]]``
                    (the console script of ``pip install -e .``; from a checkout: ``python predict_files.py
                    ...``): main.  ``python chemdata.py predict ...`` still runs it for one release.

``predictor`` holds the model side (the file's meta, preparing an input, the applicability domain, the
ensemble and its interval); this module only reads, schedules and writes.  Standard library only at module
level.
"""


if __name__ == "__main__":     # python predict_files.py ...: a Ctrl-C while it starts (imports) is one line
    import safe_io              # and exit status 130, not a traceback (safe_io imports only the standard library)
    safe_io.exit_130_on_ctrl_c("predict_files.py: interrupted (Ctrl-C)")

import argparse
import codecs
import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections import Counter, OrderedDict, namedtuple

from chemdata import DatasetFormatError, sha256_of
from predictor import DEFAULT_MAX_INPUT_TOKENS, PREDICT_STATUSES, Prediction, load_predictor
from safe_io import (BusyError, PartialFile, UnsafeOutputError, check_output, hold_lock, release_lock,
                     resolve_target, write_json)

__all__ = ["MAX_LINE_BYTES", "CHUNK_SECONDS", "PROGRESS_MIN_ROWS", "MAX_CACHE", "PredictInterrupted",
           "PredictWriteError", "predict_chunks", "predict_csv", "COMMAND", "predict_parser", "main"]


# =====================================================================================
# 1. Files: read in bounded memory, predicted in chunks, streamed out in order, resumable
# =====================================================================================
#
# One pipeline:  read (_scan_csv, then _csv_records: a stream of records, never the whole file)
#             -> dedupe (predict_chunks: each distinct input once, in chunks of about CHUNK_SECONDS)
#             -> predict in parallel (Predictor.outcomes on forked workers, identical to one process)
#             -> stream out in input order (each chunk's rows appended to <out>.partial, flushed, fsync'ed;
#                renamed over --out at the end; an interrupted run is finished by the same command plus
#                --resume, which checks the partial file against the input, the model and the options).

MAX_LINE_BYTES = 8 * 2 ** 20
"""A CSV line longer than this (8 MiB) is refused with its line number and byte offset: no molecule needs
it, and reading one would hold it whole in memory."""

CHUNK_SECONDS = 2.0
"""The pipeline predicts about this many seconds of new inputs at a time (measured as it goes), then writes
their rows: an interruption loses at most one chunk of work."""

PROGRESS_MIN_ROWS = 200
"""Files with more data rows than this get a progress line with an ETA on stderr after every chunk."""

MAX_CACHE = 100_000
"""At most this many distinct inputs' predictions are kept for reuse (the oldest go first); a repeat
further apart than that is predicted again, with the same result."""

_MAX_WINDOW_ROWS = 10_000     # rows held before a chunk is written, whatever the number of new inputs


class PredictInterrupted(KeyboardInterrupt):
    """A prediction run stopped by Ctrl-C (SIGINT) or SIGTERM after ``rows_done`` of ``total`` data rows;
    every finished row is in ``partial`` (None when the rows went to a stream)."""

    def __init__(self, signal_name, rows_done, total, partial, complete=None):
        super().__init__(f"{signal_name} after {rows_done} of {total} rows")
        self.signal_name, self.rows_done, self.total, self.partial = signal_name, rows_done, total, partial
        self.complete = complete
        """The finished output's path when the signal came after every row was written (nothing to resume)."""


class PredictWriteError(OSError):
    """Writing the rows failed (a full disk, a file size limit, a closed pipe): an OSError with the errno of
    the failed write, and ``rows_done`` of ``total`` data rows written before it; ``partial`` holds them (None
    when the rows went to a stream).  ``--resume`` finishes such a run once there is room."""

    @classmethod
    def after(cls, error, rows_done, total):
        e = cls(error.errno, f"{error.strerror or error} (after {rows_done} of {total} rows)")
        e.rows_done, e.total, e.partial = rows_done, total, None
        return e


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main process so it unwinds like Ctrl-C."""


_STOP_SIGNALS = []
"""Signals that asked the running command to stop (``_stop_on_signals`` records them).  The handler also
raises at once, but an exception raised inside an at-fork hook (a signal landing while ``parallel_map``
forks) is only printed by Python, so the pipeline checks this list after every chunk."""


def _raise_if_stopped():
    """Raise the interrupt a lost exception stood for (see _STOP_SIGNALS)."""
    if _STOP_SIGNALS:
        raise _Terminated() if _STOP_SIGNALS[-1] == signal.SIGTERM else KeyboardInterrupt()


def _scan_csv(path):
    """(encoding, note) of a CSV file, read once in 1 MiB pieces (bounded memory): 'utf-8-sig' when it is
    UTF-8 (a BOM is dropped), else 'latin-1' with a note naming the first line that is not UTF-8 (Latin-1
    decodes every byte).  Refuses at the first offending byte, with DatasetFormatError naming the file and
    the byte offset: a NUL byte (a binary file, not text) or a line over MAX_LINE_BYTES; and anything but a
    regular file (it is read twice)."""
    return _scan(path)[:2]


def _scan(path):
    """``_scan_csv``'s (encoding, note), then the bytes scanned and whether the last line lacks its newline:
    what the file held when it was scanned, the only part that is read after (it may still be growing)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise DatasetFormatError(f"{path} is not a regular file (a CSV file is read twice: a pipe cannot be)")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, newlines, open_line, bad_line, last = 0, 0, 0, None, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(2 ** 20):
            last = chunk[-1:]
            nul = chunk.find(b"\0")
            if nul >= 0:
                line = newlines + chunk.count(b"\n", 0, nul) + 1
                raise DatasetFormatError(f"{path}: NUL byte at byte offset {offset + nul} (line {line}): "
                                         "a binary file, not CSV text")
            open_line = _open_line_length(path, chunk, offset, newlines, open_line)
            if bad_line is None:
                bad_line = _first_bad_utf8_line(decoder, chunk, newlines)
            newlines += chunk.count(b"\n")
            offset += len(chunk)
    if bad_line is None:
        bad_line = _first_bad_utf8_line(decoder, b"", newlines, final=True)
    if bad_line is None:
        return "utf-8-sig", "", offset, last != b"\n"
    return "latin-1", f"{path} is not UTF-8 (line {bad_line} first); read as Latin-1", offset, last != b"\n"


def _first_bad_utf8_line(decoder, chunk, newlines, final=False):
    """The line number of the first byte of ``chunk`` that is not UTF-8 (``decoder`` carries a sequence cut
    at the previous chunk's end; those bytes hold no newline), else None."""
    carried = len(decoder.getstate()[0])
    try:
        decoder.decode(chunk, final)
    except UnicodeDecodeError as e:
        return newlines + chunk.count(b"\n", 0, max(0, e.start - carried)) + 1
    return None


def _open_line_length(path, chunk, offset, newlines, open_line):
    """The length of the line still open after ``chunk`` (``open_line`` bytes of it came before); refuses a
    line over MAX_LINE_BYTES with its number and byte offset."""
    lengths = [len(piece) for piece in chunk.split(b"\n")]
    lengths[0] += open_line
    longest = max(lengths)
    if longest > MAX_LINE_BYTES:
        i = lengths.index(longest)
        start = offset - open_line if i == 0 else offset + sum(lengths[1:i]) + lengths[0] - open_line + i
        raise DatasetFormatError(f"{path}: line {newlines + i + 1} (from byte offset {start}) is longer than "
                                 f"{MAX_LINE_BYTES // 2 ** 20} MiB: not a CSV file of inputs")
    return lengths[-1]


class _Prefix(io.RawIOBase):
    """The first ``left`` bytes of an open binary file from where it stands, as a raw stream."""

    def __init__(self, f, left):
        super().__init__()
        self.f, self.left = f, left

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.left <= 0:
            return 0
        n = self.f.readinto(memoryview(buffer)[:min(len(buffer), self.left)]) or 0
        self.left -= n
        return n


_CUT_LINE = ("no end of line, and the file has grown since it was scanned: a line cut off while the file was "
             "being written; not predicted")


def _csv_records(path, encoding, limit=None, open_end=False):
    """(line number, fields or None, csv error) for every record of the file's first ``limit`` bytes (all of
    it when None), read as a stream; a record the csv module cannot parse gives its error instead of stopping
    the rest.  ``open_end``: the last of those bytes is not a newline; if the file has grown past ``limit``
    by the time the last record is read, that record is a line cut off while written, and gets _CUT_LINE as
    its error (its fields kept)."""
    last = None
    for record in _parsed_records(path, encoding, limit):
        if last is not None:
            yield last
        last = record
    if last is not None and open_end and limit is not None and os.path.getsize(path) > limit:
        number, row, error = last
        last = (number, row, error or _CUT_LINE)
    if last is not None:
        yield last


def _parsed_records(path, encoding, limit):
    """``_csv_records`` without the last line's check."""
    with open(path, "rb") as raw:
        if encoding == "latin-1" and raw.read(3) != b"\xef\xbb\xbf":    # a UTF-8 BOM before Latin-1 text
            raw.seek(0)
        left = (os.fstat(raw.fileno()).st_size if limit is None else limit) - raw.tell()
        f = io.TextIOWrapper(io.BufferedReader(_Prefix(raw, max(left, 0)), 2 ** 16), encoding=encoding,
                             newline="")
        reader = csv.reader(f)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield reader.line_num, None, str(e)
                continue
            yield reader.line_num, row, ""


def _csv_job(record, n_fields, col):
    """A data record as (payload, item): payload = the record's fields padded or cut to the header's count;
    item = the input string, or the error ``Prediction`` of a record that is not predicted: unparsable,
    empty, cut off while the file was written, or with another number of fields than the header (a row cut
    short, or columns that would not line up)."""
    number, row, error = record
    if row is None:
        return [""] * n_fields, Prediction("", None, "error", f"line {number}: {error}")
    fields = row[:n_fields] + [""] * (n_fields - len(row))
    if error:
        return fields, Prediction(fields[col], None, "error", f"line {number}: {error}")
    if not any(field.strip() for field in row):
        return fields, Prediction("", None, "error", f"line {number} is empty")
    if len(row) != n_fields:
        extra = f" (extra: {','.join(row[n_fields:])[:60]!r})" if len(row) > n_fields else ""
        return fields, Prediction(fields[col], None, "error",
                                        f"line {number} has {len(row)} fields, the header {n_fields}: not "
                                        f"predicted, a row cut short or columns that would not line up{extra}")
    return fields, fields[col]


def _csv_text(rows, delimiter=","):
    """``rows`` as CSV (or, with a tab, TSV) text, one record per line ending in "\\n": a field holding the
    delimiter, a double quote or a line break is quoted ("..." with "" for a quote, RFC 4180), so every row
    reads back as written; a row holding a carriage return is quoted whole (Python's writer would not)."""
    buf = io.StringIO()
    plain = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    quoted = csv.writer(buf, delimiter=delimiter, lineterminator="\n", quoting=csv.QUOTE_ALL)
    for row in rows:
        (quoted if any("\r" in field for field in row) else plain).writerow(row)
    return buf.getvalue()


_ADDED_COLUMNS = ("low", "high", "spread", "status", "domain", "reason")
_STATUS_COLUMN = 4            # the status is the 5th added column: prediction_<units>, low, high, spread, status


def _output_header(units):
    """The seven columns a prediction adds: prediction_<units>, low, high, spread, status, domain, reason."""
    return [f"prediction_{units}", *_ADDED_COLUMNS]


def _output_fields(res, value_format):
    """The seven columns a prediction adds: value, low, high, spread (each empty where None, written with
    ``value_format``), status, domain (empty for an error), reason."""
    numbers = ["" if x is None else format(x, value_format) for x in (res.value, res.low, res.high, res.spread)]
    return numbers + [res.status, res.domain if res.status != "error" else "", res.reason]


def predict_chunks(predictor, jobs, workers=1):
    """The pipeline's middle: ``jobs`` yields (payload, item), item an input string or an already decided
    ``Prediction``; yields lists of (payload, Prediction) in input order, one per chunk.  A chunk is cut
    when it holds about CHUNK_SECONDS of inputs not predicted before in this run (measured as it goes) or
    _MAX_WINDOW_ROWS rows; each distinct input is predicted once (the last MAX_CACHE are kept for repeats),
    on ``workers`` processes.  A repeat gets the same ``Prediction`` object: copy it to change it."""
    cache, window, new, size = OrderedDict(), [], set(), 4 * workers
    for payload, item in jobs:
        window.append((payload, item))
        if isinstance(item, str) and item not in cache:
            new.add(item)
        if len(new) >= size or len(window) >= _MAX_WINDOW_ROWS:
            size = _predict_into(predictor, cache, new, workers, size)
            yield _resolved(window, cache)
            window, new = [], set()
    if window:
        _predict_into(predictor, cache, new, workers, size)
        yield _resolved(window, cache)


def _resolved(window, cache):
    """The window's (payload, Prediction) pairs; then the oldest predictions beyond MAX_CACHE are dropped."""
    done = [(payload, cache[item] if isinstance(item, str) else item) for payload, item in window]
    while len(cache) > MAX_CACHE:
        cache.popitem(last=False)
    return done


def _predict_into(predictor, cache, new, workers, size):
    """Predict the inputs ``new`` into ``cache``; returns the next chunk size: CHUNK_SECONDS at the rate
    just measured, between 2 per worker and 4,096."""
    if not new:
        return size
    t0 = time.perf_counter()
    cache.update(predictor.outcomes(new, workers))
    elapsed = time.perf_counter() - t0
    rate = len(new) / max(elapsed, 1e-6)
    return max(2 * workers, min(4096, int(rate * CHUNK_SECONDS)))


def _run_record(predictor, in_path, column):
    """What a resumed run must share with the interrupted one (kept in ``<out>.partial.json``): the input's
    and the model file's sha256, the column, and the options that change predictions (for an ensemble
    file, also the number of members used)."""
    model = predictor.path if predictor.path and os.path.isfile(predictor.path) else None
    return {"about": "predict --csv ... --out: the run whose rows <out>.partial holds; --resume checks it",
            "input_sha256": sha256_of(in_path), "model_sha256": sha256_of(model) if model else None,
            "column": column, "max_input_tokens": predictor.max_input_tokens, "n_random": predictor.n_random,
            **({"members": len(predictor.members)} if predictor.n_file_members > 1 else {})}


def _check_resumable(sidecar, record, partial):
    """The ``written`` entry ({bytes, sha256} of the rows written so far) of the run record ``sidecar``;
    refuses to resume ``partial`` unless that record matches this run's (input, model, options)."""
    try:
        with open(sidecar, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise DatasetFormatError(f"--resume: cannot read {sidecar}, the record of the run that wrote {partial} "
                                 f"({type(e).__name__}): remove {partial} to start again") from None
    if record["model_sha256"] is None:
        raise DatasetFormatError("--resume needs a predictor loaded from a model file (its sha256 is checked)")
    differ = [k for k in record if k != "about" and (saved.get(k) if isinstance(saved, dict) else None) != record[k]]
    if differ:
        raise DatasetFormatError(f"--resume: {partial} was written from another {', '.join(differ)} than this "
                                 f"run's: remove it to start again, or give the same input, model and options")
    written = saved.get("written")
    if not (isinstance(written, dict) and type(written.get("bytes")) is int and written["bytes"] >= 0
            and isinstance(written.get("sha256"), str)):
        raise DatasetFormatError(f"--resume: {sidecar} records no digest of the rows in {partial} (written "
                                 f"{written!r:.60}): they cannot be checked; remove {partial} to start again")
    return written


def _sha256_prefix(path, n):
    """(sha256 object of the first ``n`` bytes of the file, how many bytes it holds short of ``n``)."""
    digest, left = hashlib.sha256(), n
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(2 ** 20, left))):
            digest.update(block)
            left -= len(block)
    return digest, left


class _RunLog:
    """<out>.partial.json: the run record (what --resume must share with this run) and the size and sha256
    of the bytes written to <out>.partial so far, rewritten (atomically) after every piece appended, so that
    --resume can tell rows this command wrote from rows edited since."""

    def __init__(self, path, record, digest):
        self.path, self.record, self.digest = path, record, digest

    def save(self, size):
        write_json(self.path, {**self.record, "written": {"bytes": size, "sha256": self.digest.hexdigest()}})

    def writer(self, sink):
        """A function appending a piece of text to ``sink`` (a PartialFile) and recording it here."""
        def write(text):
            data = text.encode("utf-8")
            size = sink.append(text)
            self.digest.update(data)
            self.save(size)
        return write


def _data_rows(reader):
    """The rows of a csv reader up to the first one it cannot read (a file cut by a kill)."""
    while True:
        try:
            yield next(reader)
        except (StopIteration, csv.Error, UnicodeDecodeError):
            return


def _verified_prefix(partial, records, out_header, n_fields, limit=None):
    """(bytes to keep, rows kept, counts by status) of an interrupted run's partial file, within its first
    ``limit`` bytes (those its run record vouches for): it must start with this run's header (or a piece of
    it: nothing kept); then each row must hold the fields of the input's record at its place (``records``:
    the data records), a known status and nothing more, and end with its newline.  The longest such prefix
    is kept; the rest (a row cut by a kill, a chunk whose digest was not recorded) is dropped."""
    size, header = os.path.getsize(partial), _csv_text([out_header]).encode("utf-8")
    size = size if limit is None else min(size, limit)
    with open(partial, "rb") as f:
        start = f.read(len(header))
    if start != header or size < len(header):
        if header.startswith(start) or size < len(header):
            return 0, 0, Counter()
        raise DatasetFormatError(f"--resume: {partial} does not start with this run's header {out_header}: "
                                 "remove it to start again")
    keep, rows, counts = len(header), 0, Counter()
    with open(partial, encoding="utf-8", newline="") as f:
        written_rows = _data_rows(csv.reader(f))
        next(written_rows, None)                                 # the header, checked above
        for written in written_rows:
            record = next(records, None)
            complete = len(written) == n_fields + 1 + len(_ADDED_COLUMNS)
            status = written[n_fields + _STATUS_COLUMN] if complete else None
            if (record is None or status not in PREDICT_STATUSES
                    or written[:n_fields] != _csv_job(record, n_fields, 0)[0]):
                break
            line = len(_csv_text([written]).encode("utf-8"))
            if keep + line > size:
                break
            keep, rows = keep + line, rows + 1
            counts[status] += 1
    return keep, rows, counts


def _open_partial(predictor, in_path, column, out_path, resume, src, out_header):
    """(PartialFile, the function that writes to it, rows already done, their counts by status, notes) for
    ``--out``: the target, the partial file and its run record are checked first (``safe_io.check_output``:
    a regular file or a missing name, none of them the input or the model, in a writable folder).  A fresh
    run refuses to replace the partial file of an interrupted one; ``resume`` checks it (``_resumed``)."""
    inputs = [in_path] + ([predictor.path] if predictor.path else [])
    target = check_output(out_path, inputs=inputs)
    partial, sidecar = target + ".partial", target + ".partial.json"
    for path in (partial, sidecar):
        check_output(path, inputs=inputs)
    record = _run_record(predictor, in_path, column)
    if resume:
        return _resumed(predictor, in_path, out_path, partial, _RunLog(sidecar, record, None), src, out_header)
    if os.path.lexists(partial):
        raise DatasetFormatError(f"{partial} holds the rows of an interrupted run: add --resume to finish "
                                 "it, or remove it to start again")
    log = _RunLog(sidecar, record, hashlib.sha256())
    log.save(0)
    out = PartialFile(out_path)
    write = log.writer(out)
    write(_csv_text([out_header]))
    return out, write, 0, Counter(), []


def _resumed(predictor, in_path, out_path, partial, log, src, out_header):
    """``_open_partial`` for --resume: the run record must match this run and the partial file's recorded
    bytes their recorded sha256 (else refused: rows edited since they were written); its verified rows are
    kept, the rest dropped."""
    if not os.path.isfile(partial):
        raise FileNotFoundError(f"--resume: there is no {partial} to finish (no interrupted run of this --out)")
    written = _check_resumable(log.path, log.record, partial)
    digest, short = _sha256_prefix(partial, written["bytes"])
    if short or digest.hexdigest() != written["sha256"]:
        raise DatasetFormatError(f"--resume: {partial} was changed after this command wrote it (its first "
                                 f"{written['bytes']:,} bytes do not have the sha256 recorded in {log.path}): "
                                 "remove it to start again")
    records = itertools.islice(_csv_records(in_path, src.encoding, src.size, src.open_end), 1, None)
    keep, rows, counts = _verified_prefix(partial, records, out_header, len(src.header), written["bytes"])
    dropped = os.path.getsize(partial) - keep
    log.digest = _sha256_prefix(partial, keep)[0]
    log.save(keep)                                 # before the cut: a kill in between still resumes
    out = PartialFile(out_path, keep=keep)
    write = log.writer(out)
    if keep == 0:
        write(_csv_text([out_header]))
    return out, write, rows, counts, [f"resumed {partial}: {rows} finished rows checked against the input and "
                                      "kept" + (f", {dropped} bytes after them dropped (a row cut short)"
                                                if dropped else "")]


@contextlib.contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM wait until the block ends, so that a chunk's rows are written and counted together
    (POSIX, main thread; elsewhere nothing is held)."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _seconds(t):
    return f"{t:.0f} s" if t < 120 else f"{t / 60:.1f} min" if t < 7200 else f"{t / 3600:.1f} h"


def _write_rows(predictor, jobs, write, done, total, workers, progress):
    """Predict ``jobs`` (``predict_chunks``) and ``write`` each chunk's rows as CSV text, in input order;
    after each chunk a progress line with an ETA goes to ``progress`` (a text stream) when the file has over
    PROGRESS_MIN_ROWS rows.  Returns (rows done, counts by status of this run's rows); Ctrl-C or SIGTERM
    raises PredictInterrupted with the number of rows written, a failed write (OSError) PredictWriteError."""
    counts, start, t0 = Counter(), done, time.perf_counter()
    try:
        for chunk in predict_chunks(predictor, jobs, workers):
            rows = []
            for fields, res in chunk:
                rows.append(fields + _output_fields(res, ".6g"))
                counts[res.status] += 1
            with _signals_held():
                try:
                    write(_csv_text(rows))
                except OSError as e:
                    raise PredictWriteError.after(e, done, total) from None
                done += len(rows)
            _raise_if_stopped()
            if progress is not None and total > PROGRESS_MIN_ROWS:
                elapsed = time.perf_counter() - t0
                eta = elapsed / (done - start) * (total - done)
                print(f"predict: {done}/{total} rows ({done / total:.0%}), {_seconds(elapsed)} elapsed, "
                      f"ETA {_seconds(eta)}", file=progress, flush=True)
    except KeyboardInterrupt as e:
        raise PredictInterrupted("SIGTERM" if isinstance(e, _Terminated) else "SIGINT", done, total, None) from None
    return done, counts


_Source = namedtuple("_Source", "encoding note header col total size open_end")
"""A CSV input as scanned: encoding, note, header fields as written, the column's index, the number of data
records, the bytes scanned (the only ones read: the file may still be growing) and whether the last of them
is not a newline."""


def _csv_layout(in_path, column):
    """The ``_Source`` of a CSV file: scanned (``_scan``) and read as a stream, up to the bytes scanned;
    DatasetFormatError when ``column`` is not in the header."""
    encoding, note, size, open_end = _scan(in_path)
    records = _csv_records(in_path, encoding, size, open_end)
    first = next(records, None)
    header = first[1] if first and first[1] else []
    names = [h.strip() for h in header]
    if column not in names:
        raise DatasetFormatError(f"{in_path} has no column {column!r} (its columns: {names!r:.300})")
    return _Source(encoding, note, header, names.index(column), sum(1 for _ in records), size, open_end)


def _growth_note(in_path, src):
    """A note when the input changed size while it was read (a file still being written), else ''."""
    with contextlib.suppress(OSError):
        now = os.path.getsize(in_path)
        if now != src.size:
            return (f"{in_path} changed size while it was read ({src.size:,} bytes when scanned, {now:,} now: "
                    f"still being written?); only the {src.total} rows it held when scanned were read")
    return ""


@contextlib.contextmanager
def _one_writer(out_path, inputs):
    """Hold the lock ``<out>.lock`` (``safe_io.hold_lock``) for the block: one run writes an output at a time,
    a fresh one or a --resume.  A live holder is refused at once with UnsafeOutputError naming it (pid,
    command, start time); where the file system has no locks, the run goes on unguarded."""
    lock = check_output(resolve_target(out_path) + ".lock", inputs=inputs)
    try:
        fd, _ = hold_lock(lock)
    except BusyError as e:
        raise UnsafeOutputError(out_path, f"it is being written by {e.holder}; wait for that run to finish or "
                                          "stop it") from None
    except OSError:                                # no locks on this file system
        fd = None
    try:
        yield
    finally:
        release_lock(lock, fd)


def _finish_output(sink, done, total):
    """Rename the complete ``<out>.partial`` over the output and drop its run record, Ctrl-C and SIGTERM
    held meanwhile; one that arrived then is raised as PredictInterrupted with ``complete`` set (every row
    is written, nothing to resume)."""
    try:
        with _signals_held():
            sink.finish()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sink.target + ".partial.json")
    except KeyboardInterrupt as e:
        name = "SIGTERM" if isinstance(e, _Terminated) else "SIGINT"
        raise PredictInterrupted(name, done, total, None, complete=sink.target) from None


def predict_csv(predictor, in_path, column, out_path=None, *, workers=1, resume=False, progress=None,
                stream=None):
    """Add ``prediction_<units>``, ``low``, ``high``, ``spread``, ``status``, ``domain`` and ``reason`` columns
    (``_output_fields``) to every row of a CSV file.

    Read as UTF-8 (BOM dropped), else Latin-1 (stated), as a stream (``_scan_csv`` first refuses a binary
    file, naming the byte offset), up to the bytes it held when scanned (a file still growing: the rows
    counted at the start, its growth noted, a last line cut off mid-write not predicted).  Every record after
    the header is kept, in order, with the header's number of fields; a row that is empty, unparsable or
    has another number of fields gets an empty prediction and its line number.  Each distinct input is
    predicted once, on ``workers`` processes.  The rows go, chunk by chunk, to ``out_path`` through
    ``<out_path>.partial`` (renamed over it at the end; one run at a time: ``<out_path>.lock``; ``resume=True``
    finishes an interrupted run, see ``_open_partial``), or to ``stream``, or into the returned text.
    ``progress``: a text stream for the notes (as they arise) and progress lines.  Returns (out_path, or
    the text, or None when streamed; counts by status; notes); Ctrl-C or SIGTERM raises PredictInterrupted,
    a failed write PredictWriteError (an OSError); every finished row is kept in the partial file."""
    if resume and out_path is None:
        raise ValueError("resume needs out_path (the output whose .partial file an interrupted run left)")
    if out_path is None:
        return _predict_csv(predictor, in_path, column, None, (workers, resume, progress, stream))
    inputs = [in_path] + ([predictor.path] if predictor.path else [])
    check_output(out_path, inputs=inputs)      # refuse an unusable output before reading anything
    with _one_writer(out_path, inputs):
        return _predict_csv(predictor, in_path, column, out_path, (workers, resume, progress, stream))


def _say(progress, notes):
    for line in notes if progress is not None else ():
        print(f"predict: {line}", file=progress, flush=True)


def _predict_csv(predictor, in_path, column, out_path, options):
    """``predict_csv`` once its output is checked and held."""
    workers, resume, progress, stream = options
    src = _csv_layout(in_path, column)
    out_header = src.header + _output_header(predictor.units)
    notes, done, counts, sink = [src.note] if src.note else [], 0, Counter(), stream or io.StringIO()
    if out_path is not None:
        sink, write, done, counts, resumed = _open_partial(predictor, in_path, column, out_path, resume, src,
                                                           out_header)
        notes += resumed
    else:
        def write(text):
            return ((sink.write(text), sink.flush()))
        try:
            write(_csv_text([out_header]))
        except OSError as e:
            raise PredictWriteError.after(e, 0, src.total) from None
    _say(progress, notes)
    records = itertools.islice(_csv_records(in_path, src.encoding, src.size, src.open_end), 1 + done, None)
    jobs = (_csv_job(record, len(src.header), src.col) for record in records)
    try:
        done, new_counts = _write_rows(predictor, jobs, write, done, src.total, workers, progress)
    except (PredictInterrupted, PredictWriteError) as e:
        e.partial = sink.partial if out_path is not None else None
        raise
    finally:
        if out_path is not None:
            sink.close()                  # kept on any failure: --resume finishes it
    if out_path is not None:
        _finish_output(sink, done, src.total)
    counts.update(new_counts)
    grown = _growth_note(in_path, src)
    notes += [grown] if grown else []
    _say(progress, [grown] if grown else [])
    return out_path if out_path is not None else sink.getvalue() if stream is None else None, dict(counts), notes


# =====================================================================================
# 2. The predict command: chem-transformer-predict MODEL INPUT... (python predict_files.py ...)
# =====================================================================================

COMMAND = "chem-transformer-predict"
"""The console script ``pip install -e .`` puts on the PATH (``[project.scripts]`` in pyproject.toml)."""

_PREDICT_EPILOG = f"""\
output:
  Inputs on the command line: a context line (# model ...: the measured errors, the ensemble, the
  interval), a header row and one tab-separated line per input (input, prediction_<units>, low, high,
  spread, status, domain, reason).  --csv: the CSV file with those seven columns added to every row, to
  standard output or --out.  low and high bound the model file's calibrated interval (empty without
  one), spread is the ensemble members' standard deviation (empty for a single model); a model no better
  than the training mean on its test split says so in every row's reason.  Both are written with CSV
  quoting (RFC 4180: a field holding the delimiter, a double quote or a line break is put in double
  quotes, a quote doubled), so an input holding a tab or a newline stays one field; any CSV/TSV reader
  reads them back.

large files (--csv):
  The file is read as a stream (a binary file, or a line over {MAX_LINE_BYTES // 2 ** 20} MiB, is refused at
  once with its byte offset), up to the bytes it held when it was scanned: rows a writer adds meanwhile
  are not read (the growth is reported), and a last line cut off mid-write gets status error, as does a
  row with another number of fields than the header.  Each distinct input is predicted once, on --workers
  processes (the same values as one process).  Over {PROGRESS_MIN_ROWS} rows, a progress line with an ETA goes
  to stderr after each chunk (about {CHUNK_SECONDS:g} s of predictions).  --out is checked before any work: a \
regular file
  or a new name in an existing, writable folder, neither the input nor the model (a device, a FIFO, a
  link to one is refused).  The finished rows are appended, in input order, to OUT.partial beside OUT
  (flushed to disk after each chunk) and OUT.partial.json records the input's and the model's sha256
  and the options; at the end OUT.partial is renamed over OUT atomically.  Ctrl-C or SIGTERM keeps every written
  row there and prints the command that finishes the run: the same command plus --resume, which checks
  OUT.partial against the input, the model and the options, keeps its rows and predicts the rest (the
  result is identical to an uninterrupted run).  Without --resume an existing OUT.partial is refused.
  OUT.partial.json also records the size and sha256 of what was written after every chunk: rows edited
  since are refused by --resume.  A disk that fills up keeps the written rows the same way (the message
  gives the --resume command).  One run writes OUT at a time: a second one, fresh or --resume, is
  refused at once, naming the running one (its pid and command, from OUT.lock).

exit status:
  0 when at least one input was predicted (any status but 'error'); 1 when none was (every input an
  error, or no data rows); 2 for a usage error, an unreadable model or input file, a refused --out, or
  an output that cannot be written (a full disk); 130 after Ctrl-C, 143 after SIGTERM (interrupted: see
  above).
"""


def _at_least(minimum):
    """An argparse type: an int >= ``minimum``, else a usage error 'must be >= minimum' (exit status 2)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


@contextlib.contextmanager
def _stop_on_signals():
    """While the block runs, SIGTERM unwinds this process like Ctrl-C (``_Terminated``), and both are
    recorded in _STOP_SIGNALS (checked after every chunk, should the exception be lost); a SIGINT that this
    process was started ignoring (nohup, a background job) stays ignored.  A forked worker that inherits
    the handler just exits (its parent handles the run)."""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() != main_pid:
            os._exit(128 + signum)
        _STOP_SIGNALS.append(signum)
        raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    watched = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler
                                  else [])
    old = {signum: signal.signal(signum, handler) for signum in watched}
    _STOP_SIGNALS.clear()
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)
        _STOP_SIGNALS.clear()


def _partial_path(out):
    """``<out>.partial`` beside the file ``out`` resolves to (as PartialFile names it), or None."""
    try:
        return resolve_target(out) + ".partial"
    except (OSError, ValueError):
        return None


def _command_words():
    """How this command was started, as a user types it again: [COMMAND] for the console script, else
    ['python', the script's path as given] (``python predict_files.py`` where it is not this file)."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.splitext(script)[0] == COMMAND:
        return [COMMAND]
    return ["python", sys.argv[0] if script == "predict_files.py" else "predict_files.py"]


def _resume_command(args):
    """The command line that finishes an interrupted ``--csv ... --out`` run (adds --resume)."""
    argv = [*_command_words(), args.model, "--csv", args.csv, "--column", args.column, "--out", args.out,
            "--resume"]
    for flag, value, default in (("--max-input-tokens", args.max_input_tokens, DEFAULT_MAX_INPUT_TOKENS),
                                 ("--random-smiles", args.random_smiles, 0), ("--workers", args.workers, None),
                                 ("--max-members", args.max_members, None)):
        if value != default:
            argv += [flag, str(value)]
    return shlex.join(argv)


def _quiet_stdout():
    """After a failed write to standard output: point it at the null device, so that the interpreter's last
    flush of what is still buffered does not fail again (a second message and exit status 120)."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def _write_failed(args, e):
    """The lines of a run whose rows could not be written (PredictWriteError): where the finished rows are
    kept and the command that finishes the run once there is room, or that standard output failed."""
    if e.partial is None:
        _quiet_stdout()
        print(f"predict: cannot write to standard output: {e.strerror}", file=sys.stderr)
        return
    print(f"predict: cannot write {e.partial}: {e.strerror}; the {e.rows_done} finished rows are kept there; "
          f"once there is room, finish the run with:\n  {_resume_command(args)}", file=sys.stderr)


def _predict_csv_command(args, predictor):
    """``predict --csv``: the CSV with seven new columns (stdout or --out); context, progress and counts on
    stderr; an interrupted run says how to finish it."""
    print(f"predict: {predictor.describe()}", file=sys.stderr, flush=True)
    try:
        _, counts, _ = predict_csv(predictor, args.csv, args.column, args.out, workers=args.n_workers,
                                       resume=args.resume, progress=sys.stderr,
                                       stream=None if args.out else sys.stdout)
    except PredictInterrupted as e:
        print(f"predict: interrupted by {e.signal_name} after {e.rows_done} of {e.total} rows", file=sys.stderr)
        if e.partial:
            print(f"predict: the {e.rows_done} finished rows are kept in {e.partial}; to finish the run:\n"
                  f"  {_resume_command(args)}", file=sys.stderr)
        elif e.complete:
            print(f"predict: every row had been written: {e.complete} is complete", file=sys.stderr)
        return 143 if e.signal_name == "SIGTERM" else 130
    except PredictWriteError as e:
        _write_failed(args, e)
        return 2
    except KeyboardInterrupt as e:          # before the first chunk, or between the last one and the rename
        name = "SIGTERM" if isinstance(e, _Terminated) else "SIGINT"
        partial = args.out and _partial_path(args.out)
        if partial and os.path.isfile(partial):
            print(f"predict: interrupted by {name}; the rows finished so far are kept in {partial}; to finish "
                  f"the run:\n  {_resume_command(args)}", file=sys.stderr)
        else:
            print(f"predict: interrupted by {name} before any row was written", file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except (OSError, ValueError) as e:
        print(f"predict: {e}", file=sys.stderr)
        return 2
    print(f"predict: rows by status {counts}" + (f"; wrote {args.out}" if args.out else ""), file=sys.stderr)
    return 0 if any(n for status, n in counts.items() if status != "error") else 1


def _predict_command(args):
    """A context line (``# model ...``), a header row and one tab-separated line per input (input,
    prediction_<units>, low, high, spread, status, domain, reason), or the CSV with those seven columns
    added (see _PREDICT_EPILOG)."""
    if bool(args.csv) == bool(args.inputs):
        args.parser.error("give either inputs on the command line or --csv FILE")
    if (args.out or args.resume) and not args.csv:
        args.parser.error("--out and --resume go with --csv FILE")
    if args.resume and not args.out:
        args.parser.error("--resume finishes an interrupted --out: give the same --out")
    try:
        predictor = load_predictor(args.model, max_members=args.max_members, max_input_tokens=args.max_input_tokens,
                                   n_random=args.random_smiles)
    except (OSError, ValueError, TypeError) as e:
        print(f"predict: cannot load {args.model}: {e}", file=sys.stderr)
        return 2
    if args.workers is None:
        from transformer import default_workers
        args.n_workers = default_workers()
    else:
        args.n_workers = args.workers
    with _stop_on_signals():
        if args.csv:
            return _predict_csv_command(args, predictor)
        try:
            results = predictor.predict_detailed(args.inputs, workers=args.n_workers)
        except KeyboardInterrupt as e:
            print("predict: interrupted", file=sys.stderr)
            return 143 if isinstance(e, _Terminated) else 130
    return _print_results(predictor, results)


def _print_results(predictor, results):
    """Write the context line, the header and one tab-separated line per input to standard output; the exit
    status: 0 when an input was predicted, 1 when none was, 2 when the lines cannot be written (one line
    on stderr: a full disk, a file size limit)."""
    header = ["input", *_output_header(predictor.units)]
    facts = "".join(f"# {fact}\n" for fact in predictor.describe_lines())      # one '#' line per fact
    try:
        sys.stdout.write(facts + _csv_text([header] + [[r.input] + _output_fields(r, ".4f") for r in results],
                                           delimiter="\t"))
        sys.stdout.flush()
    except OSError as e:
        _quiet_stdout()
        print(f"predict: cannot write the results to standard output: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0 if any(r.status != "error" for r in results) else 1


def predict_parser():
    """The argparse parser of the command (``chem-transformer-predict`` or ``python predict_files.py``)."""
    predict = argparse.ArgumentParser(prog=" ".join(_command_words()),
                                      description="Predict a property with a saved model (models/*.json).",
                                      epilog=_PREDICT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    predict.add_argument("model", help="a saved model file (models/*.json)")
    predict.add_argument("inputs", nargs="*", help="SMILES or formulas, one prediction line each")
    predict.add_argument("--csv", help="input CSV file")
    predict.add_argument("--column", default="smiles", help="CSV column with the inputs (default smiles)")
    predict.add_argument("--out", help="output CSV (default: standard output); checked before any work (see below)")
    predict.add_argument("--resume", action="store_true",
                         help="finish the interrupted run that left OUT.partial (checked first; see below)")
    predict.add_argument("--workers", type=_at_least(1), default=None, metavar="N",
                         help="processes that predict (default: the CPU cores this process may use)")
    predict.add_argument("--max-input-tokens", type=_at_least(1), default=DEFAULT_MAX_INPUT_TOKENS, metavar="N",
                         help=f"refuse longer inputs at once (default {DEFAULT_MAX_INPUT_TOKENS} tokens)")
    predict.add_argument("--random-smiles", type=_at_least(0), default=0, metavar="N",
                         help="average over the canonical SMILES and N random spellings of it (default 0)")
    predict.add_argument("--max-members", type=_at_least(1), default=None, metavar="N",
                         help="use only the first N models of an ensemble file (default: all; fewer: no interval)")
    predict.set_defaults(parser=predict)
    return predict


def main(argv=None):
    """``chem-transformer-predict MODEL INPUT... | MODEL --csv IN [--column COL] [--out OUT [--resume]]``
    (``--help`` says more).  Returns the exit status (see _PREDICT_EPILOG); a usage error exits with status 2
    (SystemExit), as argparse does."""
    parser = predict_parser()
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra and not any(e.startswith("-") for e in extra):
        args.inputs += extra            # MODEL --random-smiles 3 CCO: inputs after an option
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return _predict_command(args)


def _script_main():
    """The entry of ``python predict_files.py ...``.  Run as a script, this file is module ``__main__``, a
    second copy of this module; the real one (``import predict_files``: its settings and signal state, the
    one a caller may have adjusted) runs the command."""
    import predict_files
    return predict_files.main()


if __name__ == "__main__":
    raise SystemExit(_script_main())
