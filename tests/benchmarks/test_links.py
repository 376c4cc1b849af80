"""`benchmarks/links.py`: where each worker runs, and what it writes from the benchmarks' summaries.

The measurement itself shapes links and trains for minutes; it is a benchmark, run by hand. These
check the parts that decide what it reports."""

import sys

from launching import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_hosts  # noqa: E402
import links  # noqa: E402
import render_docs  # noqa: E402


def test_workers_run_here_unless_hosts_are_named(monkeypatch):
    monkeypatch.delenv(bench_hosts.ENV_HOSTS, raising=False)
    assert bench_hosts.in_worker_host(["python", "w.py"], 1) == ["python", "w.py"]
    assert bench_hosts.worker_address(1) == "127.0.0.1"
    monkeypatch.setenv(bench_hosts.ENV_HOSTS, "ns-a=10.0.0.11,ns-b=10.0.0.12")
    assert bench_hosts.in_worker_host(["python", "w.py"], 1) == ["ip", "netns", "exec", "ns-b", "python", "w.py"]
    assert bench_hosts.worker_address(0) == "10.0.0.11"


def summary(one, two):
    return {"w1": {"examples_per_s_median": one}, "w2": {"examples_per_s_median": two},
            "scaling": round(two / (2 * one), 3), "scaling_cpu_bound": 0.9}


def test_each_configuration_gives_a_one_and_a_two_worker_row_and_the_page_shows_them():
    rows = links.rows_of("1gbit", "mgpu default", summary(1000.0, 1800.0))
    rows += links.rows_of("1gbit", "torch DDP gloo", summary(800.0, 1000.0))
    assert [(r["workers"], r["efficiency"]) for r in rows] == [(1, None), (2, 0.9), (1, None), (2, 0.625)]
    result = {"date": "2026-11-24", "machine": "2 cores", "latency_ms": 0.0, "repeats": 1, "steps": 30, "rows": rows}
    table = links.markdown(result)
    assert "| 1gbit | mgpu default | 1,000 | 1,800 | 0.9 |" in table
    page = "\n".join(render_docs._links(result))
    assert "| 1gbit | torch DDP gloo | 800 | 1,000 | 0.625 |" in page
