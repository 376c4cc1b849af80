"""The soak's plot (benchmarks/soak.py): detection and time to the first new step per fault, from
its result (results/NAME.json), as docs/soak.png."""

from __future__ import annotations

import pathlib
import sys

PLOT = pathlib.Path(__file__).resolve().parents[1] / "docs" / "soak.png"


def plot(result: dict) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak: no matplotlib: no plot", file=sys.stderr)
        return
    faults = result["faults"]
    names = [f"{f['kind']}\n{f['task'] or ('log dir' if f['kind'] == 'log-disk-full' else 'launcher')}" for f in faults]
    fig, ax = plt.subplots(figsize=(11, 4))
    xs = range(len(faults))
    ax.bar([x - 0.2 for x in xs], [f["detected_s"] or 0 for f in faults], 0.4, label="detected (s)")
    ax.bar([x + 0.2 for x in xs], [f["first_step_s"] or 0 for f in faults], 0.4, label="first new step (s)")
    ax.set_xticks(list(xs), names, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("seconds after the fault")
    ax.set_title(f"Soak, seed {result['seed']}: goodput {result['goodput']}, "
                 f"{result['charged_right']} of {len(faults)} charged right")
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=100)
