"""Repeated 1-worker and N-worker runs, interleaved, summarised for a machine shared with others.

Each run is a dict with examples_per_s, examples_per_s_median_step, cpu_ms_per_step (per worker),
load_before and per_worker. Interleaving makes slow drift in machine load hit every worker count
alike; medians drop the runs another program disturbed most.
"""
import statistics
import sys


def run_interleaved(counts, repeats, run_once):
    """{n: [run, ...]} from calling run_once(n) for every count, `repeats` rounds."""
    runs = {n: [] for n in counts}
    for rep in range(repeats):
        for n in counts:
            r = run_once(n)
            runs[n].append(r)
            print(f"# repeat {rep} workers {n}: {r['examples_per_s']:.0f} ex/s "
                  f"({r['examples_per_s_median_step']:.0f} at the median step), "
                  f"cpu {r['cpu_ms_per_step']:.1f} ms/step/worker, load {r['load_before']}",
                  file=sys.stderr, flush=True)
    return runs


def summarize(runs):
    """Medians per worker count, and scaling efficiency of 2 workers against 1 when both ran."""
    summary = {}
    for n, rs in runs.items():
        eps = [r["examples_per_s"] for r in rs]
        summary[f"w{n}"] = {
            "examples_per_s_median": round(statistics.median(eps), 1),
            "examples_per_s_at_median_step": round(statistics.median(
                r["examples_per_s_median_step"] for r in rs), 1),
            "examples_per_s_all": [round(e, 1) for e in eps],
            "spread_pct": round(100 * (max(eps) - min(eps)) / max(statistics.median(eps), 1e-9), 1),
            "cpu_ms_per_step_median": round(statistics.median(r["cpu_ms_per_step"] for r in rs), 2),
            "loads": [r["load_before"] for r in rs],
            "last_run": rs[-1]["per_worker"][0],
        }
    if 1 in runs and 2 in runs:
        w1, w2 = summary["w1"], summary["w2"]
        summary["scaling"] = round(w2["examples_per_s_median"] / (2 * w1["examples_per_s_median"]), 3)
        summary["scaling_at_median_step"] = round(
            w2["examples_per_s_at_median_step"] / (2 * w1["examples_per_s_at_median_step"]), 3)
        # Two workers on two cores cannot step faster than each one's CPU time per step.
        summary["scaling_cpu_bound"] = round(w1["cpu_ms_per_step_median"] / w2["cpu_ms_per_step_median"], 3)
    return summary
