"""The README's Speed block, from the core benchmark files demos/bench_core.py writes
(figures/bench_core_py<X.Y>.json): every number in a Python column was measured in that file's run; the
tutorial column holds only the tutorial's own figures (SPEED_REF).

    import report_bench_core
    text = report_bench_core.speed_block("figures")     # Markdown, between the README's Speed markers
"""
import glob
import json
import os

import report_kit as kit

SPEED_REF = {"suite": "59 tests in 0.8 s", "matmul_mflops": 205, "matmul_vs_naive": 10}   # the tutorial's
GENERATION_ROWS = {"lm_sample_40": "sampling 40 tokens, d=48 2-layer LM",
                   "seq2seq_greedy_30": "greedy 30 tokens, d=48 2+2-layer EncoderDecoder, 40-token source"}


def _row(label, cells, ref=""):
    return f"| {label} | " + " | ".join(cells) + f" | {ref} |"


def _step_rows(benches):
    """The training-step rows: d=48 LM, through train() with 1 and 2 workers, torch, microgpt's shape."""
    s = [b["steps"]["d48_lm"] for b in benches]
    mg = [b["steps"]["microgpt"] for b in benches]
    return [
        _row(f"training step, d=48 LM, T=40 ({s[0]['params']:,} params), ms", [f"{x['step_ms']:.0f}" for x in s]),
        _row("through `train()`, batch 16, ms per sequence: 1 worker → 2 workers (speed-up)",
             [f"{x['train_ms_per_seq_1_worker']:.0f} → {x['train_ms_per_seq_2_workers']:.0f} "
              f"({x['speedup_2_workers']:.2f}×)" if "speedup_2_workers" in x else "–" for x in s]),
        _row("same shape in PyTorch (CPU, 1 thread, float32), ms; pure Python is N× slower",
             [f"{x['torch_step_ms']:.1f}; {x['slowdown_vs_torch']:.0f}×" if "torch_step_ms" in x else "– (no torch)"
              for x in s]),
        _row(f"training step at microgpt's shape ({mg[0]['params']:,} params), ms: lists of rows vs scalar autograd",
             [f"{x['step_ms']:.1f} vs {x['scalar_autograd_step_ms']:.0f} ({x['scalar_over_lists']:.0f}×)"
              if "scalar_autograd_step_ms" in x else f"{x['step_ms']:.1f}" for x in mg])]


def _generation_rows(benches):
    """The K/V-cache and parallel_map rows (absent from older benchmark files)."""
    g = [b.get("generation") for b in benches]
    if not any(g):
        return []
    out = [_row(f"{label}: plain → K/V cache, s (speed-up)",
                [f"{x[key]['plain_s']:.2f} → {x[key]['cached_s']:.3f} ({x[key]['speedup']:.1f}×)" if x else "–"
                 for x in g]) for key, label in GENERATION_ROWS.items()]
    return out + [_row("`parallel_map`, 200 samples of 20 tokens: 1 → 2 workers, s (speed-up)",
                       [f"{x['parallel_map']['one_worker_s']:.1f} → {x['parallel_map']['two_workers_s']:.1f} "
                        f"({x['parallel_map']['speedup']:.2f}×)" if x else "–" for x in g])]


def speed_block(folder):
    """Markdown for the README's Speed section from the benchmark files of ``folder``."""
    benches = kit.bench_files(folder)
    if not benches:
        return "_No benchmark yet: run `python demos/bench_core.py`._"
    ref = SPEED_REF
    lines = ["Measured by `demos/bench_core.py` on this project's 2-core machine (files "
             "`figures/bench_core_py*.json`, each from one run). The reference column quotes only the tutorial's "
             "own figures (an Apple M-series laptop, Python 3.12, one thread).", "",
             "| measurement | " + " | ".join(f"Python {b['python']} ({b['dot_impl']})" for b in benches)
             + " | tutorial |", "|---|" + "---|" * len(benches) + "---|"]
    suites = [f"{b['suite']['last_line'].split(',')[0]} in {b['suite']['wall_time_s']:.1f} s" for b in benches]
    lines.append(_row("test suite (`python tests_transformer.py`)", suites, ref["suite"]))
    for i, shape in enumerate(benches[0]["matmul"]):
        lines.append(_row(f"`matmul` {shape['shape']}, Mflop/s (naive loop; ratio)",
                          [f"{b['matmul'][i]['matmul_mflops']:.0f} ({b['matmul'][i]['naive_mflops']:.0f}; "
                           f"{b['matmul'][i]['ratio']:.1f}×)" for b in benches],
                          f"{ref['matmul_mflops']} (about {ref['matmul_vs_naive']}× naive)" if i == 0 else ""))
    lines += _step_rows(benches) + _generation_rows(benches)
    ratios = ", ".join(f"{min(m['ratio'] for m in b['matmul']):.1f}–{max(m['ratio'] for m in b['matmul']):.1f}× "
                       f"on Python {b['python']}" for b in benches)
    lines += ["", f"*Finding:* `matmul` beats the naive triple loop by {ratios} here, against about "
              f"{ref['matmul_vs_naive']}× in the tutorial: how much the C-level iterators gain over a Python loop "
              "depends on the interpreter and the processor, so quote this ratio with both."]
    return "\n".join(lines)


def speedups_text(folder=kit.FIG_DIR):
    """'Python 3.13.0: 2.9–3.2×, ...': matmul over the naive loop in each benchmark file (unreadable files
    skipped), for experiment 1's page."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "bench_core_py*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                b = json.load(f)
            sp = [x["naive_s"] / x["matmul_s"] if "naive_s" in x else x["matmul_mflops"] / x["naive_mflops"]
                  for x in b["matmul"]]
            out.append(f"Python {b['python']}: {min(sp):.1f}–{max(sp):.1f}×")
        except (OSError, ValueError, KeyError, ZeroDivisionError):
            continue
    return ", ".join(out)
