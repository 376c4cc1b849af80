"""`make bench WORKERS=...`: worker counts, the cores check and the per-count figures.

The sweep itself trains for minutes per count; it is a benchmark, run by hand. These check what
it computes and writes from the benchmarks' summaries.
"""

import json
import sys

import pytest

from launching import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import worker_sweep  # noqa: E402


def test_counts_are_parsed_sorted_and_include_one_worker():
    assert worker_sweep.parse_counts("8,2,4") == [1, 2, 4, 8]
    assert worker_sweep.parse_counts("1,2,2") == [1, 2]
    for bad in ("1,x", "0,2"):
        with pytest.raises(SystemExit, match="--workers"):
            worker_sweep.parse_counts(bad)


def test_counts_above_the_cores_are_refused_unless_oversubscribed(capsys):
    worker_sweep.check_cores([1, 2, 4], cores=4, oversubscribe=False)
    with pytest.raises(SystemExit, match="8, 16 workers need as many cores; this machine has 4"):
        worker_sweep.check_cores([1, 8, 16], cores=4, oversubscribe=False)
    worker_sweep.check_cores([1, 8], cores=4, oversubscribe=True)
    assert "warning: 8 workers need as many cores" in capsys.readouterr().err


def summary(eps, cpu):
    """A benchmark summary as benchmarks/interleaved.py writes it."""
    return {f"w{n}": {"examples_per_s_median": e, "cpu_ms_per_step_median": c, "examples_per_s_all": [e]}
            for (n, e), c in zip(eps.items(), cpu)}


def test_efficiency_and_cpu_bound_per_count(tmp_path):
    mgpu = worker_sweep.per_count(summary({1: 1000.0, 2: 1800.0, 4: 3200.0}, [100.0, 110.0, 125.0]), [1, 2, 4])
    assert mgpu["2"]["efficiency"] == 0.9 and mgpu["4"]["efficiency"] == 0.8
    assert mgpu["2"]["cpu_bound"] == pytest.approx(100 / 110, abs=1e-3)
    assert mgpu["1"] == {**mgpu["1"], "efficiency": 1.0, "cpu_bound": 1.0}
    result = {"machine": {"cpu": "Test CPU", "cores": 4, "date": "today", "load_at_start": 0.1},
              "counts": [1, 2, 4], "repeats": 1, "steps": 10,
              "variants": {"mgpu default": mgpu, "torch DDP gloo": mgpu}}
    table = worker_sweep.markdown(result)
    assert "| workers | mgpu default | torch DDP gloo |" in table
    assert "| 4 | 3,200 ex/s, eff. 0.80, CPU 125 ms/step (bound 0.80) |" in table
    paths = worker_sweep.write(result, tmp_path)
    assert [p.name for p in paths] == ["workers-4cores.json", "workers-4cores.md"]
    assert json.loads(paths[0].read_text())["variants"]["mgpu default"]["2"]["efficiency"] == 0.9
    assert paths[1].read_text() == table
