"""The trainer under the real `mgpu launch`: identical replicas, an evaluator, TensorFlow's C++ records
hidden unless asked for, preemption and resume, and the slow worker named from its own time split."""

import json
import pathlib
import signal

import psutil
import pytest
from needs import installed_version

import cpu_limits
from launcher import protocol
from launcher.supervise import diagnosis
from launching import finish, start_mgpu, wait_for, wait_for_line
from trainer_helpers import FAST

pytestmark = pytest.mark.slow
installed_version("tensorflow", "the train extra")

# What a worker logs when the coordination service it talks to has gone away first.
UNCLEAN_EXIT = ("CoordinationService", "have crashed", "Heartbeat")
# A record TensorFlow's gRPC server logs at INFO level once it listens (after the start-up banner).
SERVER_STARTED = "Started server with target"
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def run_record(log_dir, run_id):
    return json.loads((log_dir / run_id / "run.json").read_text())


def test_two_workers_and_an_evaluator_through_the_launcher(tmp_path):
    model_dir, log_dir = tmp_path / "model", tmp_path / "runs"
    code, out = finish(start_mgpu(
        "launch", "--local", "2", "--evaluator", "--threads-per-task", "1", "--log-dir", str(log_dir), "--run-id", "with-evaluator",
        "--", *FAST, "--train-steps", "60", "--eval-every", "30", "--batch-size-per-replica", "32",
        "--model-dir", str(model_dir), "--evaluator-timeout", "120", cwd=tmp_path), 240)
    assert code == 0, out[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["num_replicas"] == 2 and metrics["global_step"] == 60
    assert len(set(metrics["replica_fingerprints"])) == 1 and len(metrics["replica_fingerprints"]) == 2
    assert json.loads((model_dir / "eval_results.json").read_text())["final"]["checkpoint"] == "ckpt-60"
    assert "[mgpu] all 3 tasks ready" in out
    assert not [word for word in UNCLEAN_EXIT if word in out]
    chatter = [line for line in out.splitlines()
               if diagnosis.is_noise(line.split("] ", 1)[-1]) and line.split("] ", 1)[-1].strip()]
    assert chatter == [], chatter
    closing = out.splitlines()[-1]
    assert closing.startswith("[mgpu] done: 3 tasks succeeded in ") and closing.endswith("/runs/with-evaluator/")
    # The chief's progress, drawn by the launcher as a bar with rate and ETA; the log keeps the protocol lines.
    bars = [line for line in out.splitlines() if line.startswith("[worker:0] ") and " steps/s]" in line]
    assert bars and bars[-1].startswith("[worker:0] 100%|") and "| 60/60 [" in bars[-1], out[-3000:]
    assert not [line for line in out.splitlines() if line.startswith("[worker:1] ") and " steps/s]" in line]
    assert "MGPU_PROGRESS 60/60" in (log_dir / "with-evaluator" / "worker-0.log").read_text()
    assert "MGPU_PROGRESS" not in out
    assert run_record(log_dir, "with-evaluator")["status"] == "succeeded"
    for name in ("worker-0", "worker-1", "evaluator-0"):
        log = (log_dir / "with-evaluator" / f"{name}.log").read_text()
        assert not [word for word in UNCLEAN_EXIT if word in log], log[-3000:]
        # TensorFlow's C++ INFO records are hidden by default (TF_CPP_MIN_LOG_LEVEL); it prints its
        # start-up notices whatever that says: the logs have them, the console does not.
        assert SERVER_STARTED not in log and ABSL_PREAMBLE in log
        # Every worker says how its time split between computing and waiting for the other; the evaluator is no part of that.
        splits = [protocol.parse_time_split(line) for line in log.splitlines() if line.startswith(protocol.TIME_SPLIT_PREFIX)]
        assert all(splits) and (len(splits) > 0) == name.startswith("worker"), log[-3000:]


def test_preempted_worker_restarts_the_cluster_which_resumes_and_tf_logs_show_where_asked_for(tmp_path):
    """SIGTERM to one worker only: the other learns of it by collective, both save the same step and
    exit 42, the launcher restarts the cluster, and it resumes there to identical replicas. On the
    way, what the evaluator run above hides is shown: --tf-log-level 0 and --show-tf-logs."""
    model_dir, log_dir = tmp_path / "model", tmp_path / "runs"
    # Exercise the tunable all-reduce on the way: float16 on the wire, small packs.
    proc = start_mgpu(
        "launch", "--local", "2", "--threads-per-task", "1", "--log-dir", str(log_dir), "--run-id", "preempted", "--grace-period", "30",
        "--show-tf-logs", "--", *FAST, "--train-steps", "200", "--log-every", "20", "--steps-per-loop", "5", "--tf-log-level", "0",
        "--allreduce-dtype", "float16", "--bytes-per-pack", "4096",
        "--batch-size-per-replica", "32", "--checkpoint-every", "1000", "--model-dir", str(model_dir), cwd=tmp_path)
    seen = []
    try:
        # Preempt worker:1 once training is under way: when the first training line is out.
        for line in proc.stdout:  # ends at end of output: the loop is bounded by the run
            seen.append(line)
            if line.startswith("[worker:0] train step=20/200"):
                break
        worker = psutil.Process(run_record(log_dir, "preempted")["attempts"][0]["tasks"]["worker:1"]["pid"])
        # Frozen while it gets the signal: the cluster cannot finish first, however fast it trains
        # (the other worker waits for it in the next collective).
        worker.suspend()
        worker.send_signal(signal.SIGTERM)
        worker.resume()
    finally:
        code, out = finish(proc, 240)
        out = "".join(seen) + out
    assert code == 0, out[-3000:]
    attempts = run_record(log_dir, "preempted")["attempts"]
    assert len(attempts) == 2
    assert {t["exit_code"] for t in attempts[0]["tasks"].values()} == {42}
    saved = {line.split(" ", 1)[0]: int(line.split("preempted; checkpoint saved at step ")[1].split()[0])
             for line in out.splitlines() if "preempted; checkpoint saved at step " in line}
    assert set(saved) == {"[worker:0]", "[worker:1]"} and len(set(saved.values())) == 1, out[-3000:]
    step = saved["[worker:0]"]
    assert 20 <= step < 200 and step % 5 == 0
    assert (model_dir / f"ckpt-{step}.index").exists()
    assert "resumed from" in out and f"at step {step}" in out
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 200
    assert len(metrics["replica_fingerprints"]) == 2 and len(set(metrics["replica_fingerprints"])) == 1
    logs = [(log_dir / "preempted" / f"worker-{i}.log").read_text() for i in (0, 1)]
    # The chief says each checkpoint it keeps (the preemption's, the last), in its log, not on the console.
    said = [line for line in logs[0].splitlines() if line.startswith("MGPU_CHECKPOINT ")]
    assert said[0] == f"MGPU_CHECKPOINT {step}" and said[-1] == "MGPU_CHECKPOINT 200", said
    assert "MGPU_CHECKPOINT" not in logs[1] and "MGPU_CHECKPOINT" not in out
    assert all(SERVER_STARTED in log for log in logs)
    for name in ("worker:0", "worker:1"):
        assert f"[{name}] {ABSL_PREAMBLE}" in out
        assert any(line.startswith(f"[{name}] I") and SERVER_STARTED in line for line in out.splitlines())


def time_splits(log: pathlib.Path) -> list[tuple[int, int]]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [split for line in lines if (split := protocol.parse_time_split(line))]


def wait_share(splits: list[tuple[int, int]]) -> float:
    return sum(wait for _, wait in splits) / max(1, sum(compute + wait for compute, wait in splits))


def test_the_worker_slowed_by_a_cpu_quota_waits_least_and_is_named_from_its_time_split(tmp_path):
    """Under the launcher every worker prints how its time splits between computing and waiting in
    the gradient exchange, and the launcher names the slow one from these exact figures. Worker 1
    is slowed once it trains (before, TensorFlow's start would take minutes at its quota): worker 0
    then waits for it, and it hardly waits (only its own share of the all-reduce's work, slowed
    too). A tenth of a core, and worker 0 first in line for a CPU (a cgroup weighted well above the
    rest of the machine, cpu_limits.PRIORITY_WEIGHT): on a busy machine a free worker may otherwise
    itself get no more than a third of a core. A batch of 1024 makes each step's computation
    outweigh the all-reduce many times."""
    log_dir, console = tmp_path / "runs", tmp_path / "console.txt"
    with open(console, "w") as out:
        proc = start_mgpu(
            "launch", "--local", "2", "--threads-per-task", "1", "--log-dir", str(log_dir), "--run-id", "split",
            "--slow-window", "15", "--start-timeout", "240", "--",
            *FAST, "--batch-size-per-replica", "1024", "--steps-per-loop", "2", "--gradient-exchange", "allreduce",
            "--train-steps", "1000000", "--log-every", "1000000", cwd=tmp_path, stdout=out)
    logs = [log_dir / "split" / f"worker-{i}.log" for i in range(2)]
    try:
        with cpu_limits.cpu_quota(0.1) as slow, cpu_limits.cpu_weight(cpu_limits.PRIORITY_WEIGHT) as favoured:
            wait_for(lambda: time_splits(logs[1]) or proc.poll() is not None, 240,
                     lambda: console.read_text()[-3000:])
            assert proc.poll() is None, console.read_text()[-3000:]
            pids = {name: task["pid"] for name, task in run_record(log_dir, "split")["attempts"][0]["tasks"].items()}
            favoured.add_tree(pids["worker:0"])
            slow.add_tree(pids["worker:1"])
            moved = [len(time_splits(log)) for log in logs]
            wait_for_line(console, "is the slowest", 180, proc)
            # Each worker's next line still covers time from before the move; the three after it do not.
            wait_for(lambda: all(len(time_splits(log)) >= n + 4 for log, n in zip(logs, moved)), 240,
                     lambda: console.read_text()[-3000:])
    finally:
        proc.terminate()
        code, _ = finish(proc, 120)
    named = [line for line in console.read_text().splitlines() if "is the slowest" in line]
    assert len(named) == 1 and named[0].startswith("[mgpu] worker:1 on 127.0.0.1 is the slowest: busy ") \
        and named[0].endswith("(its own time split)"), named
    assert "MGPU_TIME_SPLIT" not in console.read_text()
    fast, slowed = (time_splits(log)[n + 1:n + 4] for log, n in zip(logs, moved))
    figures = f"worker 0: {fast}, worker 1 (slowed): {slowed}"
    assert wait_share(fast) > 0.5, figures
    assert wait_share(slowed) < wait_share(fast) / 2, figures
