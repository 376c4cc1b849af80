"""`mgpu launch --slurm` inside real allocations of a real (one-node) Slurm cluster."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from launcher.host import proctree
from launcher.host.interfaces import interface_holding, local_addresses, source_address_toward
from slurm_helpers import SlurmLab, free_ports_in_a_row

MGPU = [sys.executable, "-m", "launcher"]
NODE = socket.gethostname()
NODE_INTERFACE = interface_holding([source_address_toward(NODE)], local_addresses())


def run_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def in_allocation(slurm: SlurmLab, tmp_path: pathlib.Path, argv: list[str], tasks: int = 2,
                  timeout: float = 120) -> subprocess.CompletedProcess:
    """`salloc -n TASKS ARGV` with the output of ARGV; fails the test when it runs too long."""
    try:
        return slurm.run("salloc", "--quiet", f"--ntasks={tasks}", "--time=10", *argv, timeout=timeout, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv} did not finish in {timeout} s:\n{exc.stdout}\n{exc.stderr}")


def launch_argv(tmp_path: pathlib.Path, rid: str, *args: str) -> list[str]:
    return [*MGPU, "launch", "--slurm", "--log-dir", str(tmp_path / "runs"), "--run-id", rid, "--grace-period", "5",
            *args]


def run_record(tmp_path: pathlib.Path, rid: str) -> dict:
    return json.loads((tmp_path / "runs" / rid / "run.json").read_text())


def tagged_processes(rid: str) -> list[psutil.Process]:
    found = []
    for proc in proctree.every_process():
        try:
            if proc.environ().get("MGPU_RUN_ID") == rid:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_nothing_left(slurm: SlurmLab, rid: str, job_alive: bool = False) -> None:
    """No process of the run and no job step remain (nor any job, unless `job_alive`)."""
    def left():
        return tagged_processes(rid) or slurm.run("squeue", "-h", "-s").stdout.strip() or (
            not job_alive and slurm.run("squeue", "-h").stdout.strip())

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(rid) == []
    assert slurm.run("squeue", "-h", "-s").stdout.strip() == ""


# A task program: prints what it was given, then does what its rank is told to in TEST_ORDERS.
PROGRAM = r"""
import json, os, signal, sys, time
rank = int(os.environ["SLURM_PROCID"])
attempt = os.environ["MGPU_ATTEMPT"]
orders = json.loads(os.environ.get("TEST_ORDERS", "{}"))
order = orders.get(f"{rank}@{attempt}", orders.get(str(rank), "exit0"))
def on_term(signum, frame):
    print("got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
seen = {k: os.environ.get(k) for k in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "MGPU_TASK_TYPE", "MGPU_TASK_INDEX",
                                       "SLURMD_NODENAME", "MGPU_SLURM_PLAN", "EXTRA", "NCCL_SOCKET_IFNAME",
                                       "GLOO_SOCKET_IFNAME")}
print("SEEN " + json.dumps(seen), flush=True)
print(f"to stderr from {rank}", file=sys.stderr, flush=True)
if order == "fail":
    sys.exit(1)
if order == "forever":
    while True:
        time.sleep(0.2)
"""


def program(tmp_path: pathlib.Path) -> list[str]:
    path = tmp_path / "task.py"
    path.write_text(PROGRAM)
    return [sys.executable, str(path)]


def seen_by_task(stdout: str) -> dict[str, dict]:
    """The SEEN line of each task, by its console prefix."""
    seen = {}
    for line in stdout.splitlines():
        prefix, _, rest = line.partition("] SEEN ")
        if rest:
            seen[prefix.lstrip("[")] = json.loads(rest)
    return seen


def test_tasks_get_their_plan_and_output_is_split_per_task(slurm, tmp_path):
    rid = run_id("plan")
    port = free_ports_in_a_row(3)
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--chief", "--env", "EXTRA=x y", "--port", str(port),
                                                      "--gpus-per-task", "0", "--", *program(tmp_path)), tasks=3)
    assert done.returncode == 0, done.stdout + done.stderr
    record = run_record(tmp_path, rid)
    assert record["status"] == "succeeded"
    planned = {plan["name"]: plan for plan in record["plans"]}
    seen = seen_by_task(done.stdout)
    assert set(seen) == {"chief:0", "worker:0", "worker:1"}
    for name, task in seen.items():
        assert task["TF_CONFIG"] == planned[name]["env"]["TF_CONFIG"]  # byte for byte what was planned
        assert task["SLURMD_NODENAME"] == NODE and task["EXTRA"] == "x y"
        assert task["CUDA_VISIBLE_DEVICES"] == ""  # Slurm set none, so the plan's stands
        assert task["MGPU_SLURM_PLAN"] is None  # the launcher's hand-over does not reach the program
        assert (task["MGPU_TASK_TYPE"], task["MGPU_TASK_INDEX"]) == tuple(name.split(":"))
        # The interface that holds the node's address (the node is this machine, named as it is).
        assert NODE_INTERFACE is not None
        assert (task["NCCL_SOCKET_IFNAME"], task["GLOO_SOCKET_IFNAME"]) == (f"={NODE_INTERFACE}", NODE_INTERFACE)
    assert json.loads(seen["worker:1"]["TF_CONFIG"]) == {
        "cluster": {"chief": [f"{NODE}:{port}"], "worker": [f"{NODE}:{port + 1}", f"{NODE}:{port + 2}"]},
        "task": {"type": "worker", "index": 1}}
    # Each task's lines, stdout and stderr, land in its own log, and on the console under its name.
    for rank, name in enumerate(["chief:0", "worker:0", "worker:1"]):
        log = (tmp_path / "runs" / rid / f"{name.replace(':', '-')}.log").read_text()
        assert f"to stderr from {rank}" in log and "SEEN" in log
        assert f"[{name}] to stderr from {rank}" in done.stdout
        assert all(f"to stderr from {other}" not in log for other in range(3) if other != rank)


def test_fail_fast_stops_the_step(slurm, tmp_path):
    rid = run_id("failfast")
    env_plan = json.dumps({"0": "forever", "1": "fail"})
    start = time.monotonic()
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}",
                                                      "--", *program(tmp_path)))
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worker:1 on" in done.stderr and "exited with code 1" in done.stderr
    assert elapsed < 60
    attempt = run_record(tmp_path, rid)["attempts"][0]["tasks"]
    assert attempt["worker:1"]["exit_code"] == 1
    # worker:0 never ends by itself: it was stopped, by its SIGTERM handler or by a signal.
    assert attempt["worker:0"]["exit_code"] in (143, None) and attempt["worker:0"]["exit_code"] != 0
    assert run_record(tmp_path, rid)["status"] == "failed"
    assert_nothing_left(slurm, rid)


def test_restart_runs_a_new_step(slurm, tmp_path):
    rid = run_id("restart")
    env_plan = json.dumps({"1@0": "fail"})
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--max-restarts", "1", "--env",
                                                      f"TEST_ORDERS={env_plan}", "--", *program(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    record = run_record(tmp_path, rid)
    assert [a["outcome"] for a in record["attempts"]] == ["failed", "succeeded"]
    assert record["attempts"][0]["tasks"]["worker:1"]["exit_code"] == 1
    assert record["attempts"][1]["tasks"]["worker:1"]["exit_code"] == 0
    log = (tmp_path / "runs" / rid / "worker-1.log").read_text()
    assert log.count("SEEN") == 2 and "----- mgpu: attempt 2 started" in log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_to_the_launcher_stops_every_task(slurm, tmp_path, signum):
    """SIGTERM: each task gets SIGTERM and mgpu exits 143. SIGKILL: srun, bound to the launcher's
    life, ends the step at once, while the allocation itself lives on."""
    rid = run_id("signal")
    env_plan = json.dumps({"0": "forever", "1": "forever"})
    pid_file, gone_file, sleep_file = tmp_path / "mgpu.pid", tmp_path / "launcher-gone", tmp_path / "sleep.pid"
    argv = launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}", "--", *program(tmp_path))
    script = f"{shlex.join(argv)} & echo $! > {pid_file}; wait $!; code=$?; "
    if signum == signal.SIGKILL:  # keep the allocation while the test looks
        script += f"sleep 60 & echo $! > {sleep_file}; touch {gone_file}; wait $!; "
    script += "exit $code"
    proc = subprocess.Popen(["salloc", "--quiet", "--ntasks=2", "--time=10", "sh", "-c", script], env=slurm.env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        logs = [tmp_path / "runs" / rid / f"worker-{i}.log" for i in range(2)]
        deadline = time.monotonic() + 60
        while not all(log.exists() and "SEEN" in log.read_text() for log in logs):
            assert time.monotonic() < deadline and proc.poll() is None, "the tasks did not start"
            time.sleep(0.2)
        os.kill(int(pid_file.read_text()), signum)
        if signum == signal.SIGKILL:
            deadline = time.monotonic() + 20
            while not gone_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert_nothing_left(slurm, rid, job_alive=True)
            assert slurm.run("squeue", "-h").stdout.strip(), "the allocation should still be there"
            os.kill(int(sleep_file.read_text()), signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_nothing_left(slurm, rid)
    if signum == signal.SIGTERM:
        assert proc.returncode == 143, out + err
        assert all("got SIGTERM" in log.read_text() for log in logs)
        assert run_record(tmp_path, rid)["status"] == "interrupted"


def test_scancel_stops_everything(slurm, tmp_path):
    rid = run_id("scancel")
    env_plan = json.dumps({"0": "forever", "1": "forever"})
    argv = launch_argv(tmp_path, rid, "--env", f"TEST_ORDERS={env_plan}", "--", *program(tmp_path))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec " + shlex.join(argv) + "\n")
    submitted = slurm.run("sbatch", "--parsable", "--ntasks=2", "--time=10", f"--output={tmp_path}/job.out",
                          str(script), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    logs = [tmp_path / "runs" / rid / f"worker-{i}.log" for i in range(2)]
    deadline = time.monotonic() + 60
    while not all(log.exists() and "SEEN" in log.read_text() for log in logs):
        assert time.monotonic() < deadline, "the tasks did not start: " + slurm.run("squeue").stdout
        time.sleep(0.2)
    assert slurm.run("scancel", job).returncode == 0
    assert_nothing_left(slurm, rid)
    # Slurm sent SIGTERM to the batch script (mgpu) and to the step; mgpu stopped every task.
    assert run_record(tmp_path, rid)["status"] == "interrupted"
    assert all("got SIGTERM" in log.read_text() for log in logs)


def test_tf_config_from_slurm_in_a_step(slurm, tmp_path):
    done = in_allocation(slurm, tmp_path, ["srun", "--label", *MGPU, "tf-config", "--from-slurm", "--port", "3000",
                                           "--chief", "--format", "env"], tasks=3)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["0"].startswith("export TF_CONFIG=")
    cluster = {"chief": [f"{NODE}:3000"], "worker": [f"{NODE}:3001", f"{NODE}:3002"]}
    for rank, task in enumerate([("chief", 0), ("worker", 0), ("worker", 1)]):
        tf_config = json.loads(lines[str(rank)].split("=", 1)[1].strip("'"))
        assert tf_config == {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}


def test_a_dozen_tasks_each_get_their_own_lines(slurm, tmp_path):
    """srun pads labels (" 3: ") once there are ten tasks or more; no line may land in another's log."""
    rid = run_id("dozen")
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--", "sh", "-c",
                                                      'for i in 1 2 3; do echo "line $i of $SLURM_PROCID"; done; '
                                                      'echo "err of $SLURM_PROCID" >&2'), tasks=12)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(12):
        log = (tmp_path / "runs" / rid / f"worker-{rank}.log").read_text().splitlines()
        assert sorted(log) == sorted([f"line {i} of {rank}" for i in (1, 2, 3)] + [f"err of {rank}"]), log


def test_tf_config_from_slurm_as_the_readme_writes_it(slurm, tmp_path):
    """`eval "$(mgpu tf-config --from-slurm --format env)"` in each task of a hand-written step."""
    mgpu = shlex.join(MGPU)
    done = in_allocation(slurm, tmp_path, ["srun", "--label", "sh", "-c",
                                           f'eval "$({mgpu} tf-config --from-slurm --format env)"; '
                                           'exec python3 -c "import os; print(os.environ[\'TF_CONFIG\'])"'])
    assert done.returncode == 0, done.stderr
    seen = {rank: json.loads(text) for rank, text in (line.split(": ", 1) for line in done.stdout.splitlines())}
    assert {rank: tf["task"]["index"] for rank, tf in seen.items()} == {"0": 0, "1": 1}
    assert seen["1"]["cluster"] == {"worker": [f"{NODE}:2222", f"{NODE}:2223"]}


LONG_LINES = r"""
import json, os, sys
rank = os.environ["SLURM_PROCID"]
for n in (0, 1, 1022, 1023, 1024, 1025, 2047, 2048, 2049, 5000):
    sys.stdout.write(rank * n + "\n")
    print(f"err {n} of {rank}", file=sys.stderr, flush=True)
sys.stdout.write(json.dumps({"rank": rank, "values": list(range(50000))}) + "\n")
"""


def test_srun_pieces_of_a_long_line_are_joined_again(slurm, tmp_path):
    """srun --label cuts lines into 1 KiB pieces; each task's log gets its lines whole, byte for byte."""
    rid = run_id("long")
    script = tmp_path / "long.py"
    script.write_text(LONG_LINES)
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--", sys.executable, str(script)))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        lines = (tmp_path / "runs" / rid / f"worker-{rank}.log").read_bytes().split(b"\n")
        lengths = (0, 1, 1022, 1023, 1024, 1025, 2047, 2048, 2049, 5000)
        document = json.dumps({"rank": str(rank), "values": list(range(50000))}).encode()
        assert [line for line in lines if not line.startswith(b"err")] == [
            str(rank).encode() * n for n in lengths] + [document, b""]
        assert [line for line in lines if line.startswith(b"err")] == [b"err %d of %d" % (n, rank) for n in lengths]


def test_a_hostile_progress_line_stops_nothing_in_a_step(slurm, tmp_path):
    rid = run_id("hostile")
    script = tmp_path / "p.sh"
    script.write_text('echo MGPU_TASK_READY\necho "MGPU_PROGRESS \u00b2/3"\nseq 20000\n')
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--", "sh", str(script)))
    assert done.returncode == 0, done.stdout + done.stderr
    expected = "MGPU_TASK_READY\nMGPU_PROGRESS \u00b2/3\n".encode() + b"".join(b"%d\n" % i for i in range(1, 20001))
    for rank in range(2):
        assert (tmp_path / "runs" / rid / f"worker-{rank}.log").read_bytes() == expected
    assert "[worker:1] 20000\n" in done.stdout and "[mgpu] done: 2 tasks succeeded" in done.stdout


# Writes the environment it was given to DIR/env-<rank>.json.
ENV_WRITER = r"""
import json, os, sys
path = os.path.join(sys.argv[1], f"env-{os.environ['SLURM_PROCID']}.json")
with open(path + ".part", "w") as f:
    json.dump(dict(os.environ), f)
os.rename(path + ".part", path)
"""

JOB_NAMES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID",
             "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_CPU_COLLECTIVES_IMPLEMENTATION")


def test_each_task_of_a_step_gets_the_keras_torch_and_jax_variables(slurm, tmp_path):
    """What the tasks of a real step find in their environment: the job's variables, numbered as
    TF_CONFIG, the plan's CUDA_VISIBLE_DEVICES (Slurm bound no GPUs), never the launcher's own
    values, and none of the job's variables for the evaluator."""
    rid = run_id("vars")
    port = free_ports_in_a_row(4)
    found = tmp_path / "env"
    found.mkdir()
    script = tmp_path / "env.py"
    script.write_text(ENV_WRITER)
    argv = launch_argv(tmp_path, rid, "--chief", "--evaluator", "--port", str(port), "--gpus-per-task", "0",
                       "--", sys.executable, str(script), str(found))
    # The launcher's own values of these must not reach a task.
    stale = {"CUDA_VISIBLE_DEVICES": "5", "RANK": "9", "JAX_PROCESS_ID": "9", "KERAS_DISTRIBUTION_PROCESS_ID": "9"}
    done = slurm.run("salloc", "--quiet", "--ntasks=4", "--time=10", *argv, env={**slurm.env, **stale}, cwd=tmp_path,
                     timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    envs = [json.loads((found / f"env-{rank}.json").read_text()) for rank in range(4)]
    addresses = [f"{NODE}:{port + i}" for i in range(3)]
    for rank, (kind, index) in enumerate([("chief", 0), ("worker", 0), ("worker", 1)]):
        env = envs[rank]
        assert json.loads(env["TF_CONFIG"]) == {"cluster": {"chief": addresses[:1], "worker": addresses[1:]},
                                                "task": {"type": kind, "index": index}}
        assert {name: env.get(name) for name in JOB_NAMES} == {
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(addresses), "KERAS_DISTRIBUTION_NUM_PROCESSES": "3",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
            "RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": NODE, "MASTER_PORT": str(port),
            "JAX_COORDINATOR_ADDRESS": addresses[0], "JAX_NUM_PROCESSES": "3", "JAX_PROCESS_ID": str(rank),
            "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["SLURM_PROCID"] == str(rank)
    evaluator = envs[3]
    assert json.loads(evaluator["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    assert {name: evaluator.get(name) for name in JOB_NAMES} == dict.fromkeys(JOB_NAMES)
    assert evaluator["CUDA_VISIBLE_DEVICES"] == ""


# Rank 0 ignores SIGTERM, writes its pid to DIR/stubborn, and runs until it is killed; rank 1
# fails once DIR/go is there.
FAILS_BESIDE_A_STUBBORN_TASK = r"""
import os, signal, sys, time
if os.environ["SLURM_PROCID"] == "1":
    while not os.path.exists(os.path.join(sys.argv[1], "go")):
        time.sleep(0.05)
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(sys.argv[1], "stubborn.part"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(sys.argv[1], "stubborn.part"), os.path.join(sys.argv[1], "stubborn"))
while True:
    time.sleep(1)
"""


def test_slurm_itself_ends_the_step_when_a_task_fails(slurm, tmp_path):
    """srun runs with --kill-on-bad-exit: while mgpu is stopped (SIGSTOP), so that only Slurm can
    act, a task that ignores SIGTERM still ends as soon as its peer has failed."""
    rid = run_id("kill-on-bad-exit")
    script, signs, pid_file = tmp_path / "stubborn.py", tmp_path / "signs", tmp_path / "mgpu.pid"
    script.write_text(FAILS_BESIDE_A_STUBBORN_TASK)
    signs.mkdir()
    argv = launch_argv(tmp_path, rid, "--", sys.executable, str(script), str(signs))
    argv[argv.index("--grace-period") + 1] = "600"
    proc = subprocess.Popen(["salloc", "--quiet", "--ntasks=2", "--time=10", "sh", "-c",
                             f"{shlex.join(argv)} & echo $! > {pid_file}; wait $!"],
                            env=slurm.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    launcher = None
    try:
        deadline = time.monotonic() + 60
        while not ((signs / "stubborn").exists() and pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None, "the tasks did not start"
            time.sleep(0.1)
        launcher = int(pid_file.read_text())
        stubborn = psutil.Process(int((signs / "stubborn").read_text()))
        os.kill(launcher, signal.SIGSTOP)
        (signs / "go").touch()
        stubborn.wait(60)  # raises TimeoutExpired if Slurm left it running
        os.kill(launcher, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the test failed: end mgpu (its grace period is long), the job, salloc
            if launcher is not None:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(launcher, signum)
                    except ProcessLookupError:
                        pass
            slurm.run("scancel", "--full", "--user", "root")
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "mgpu: error: worker:1 on" in err and "exited with code 1" in err
    tasks = run_record(tmp_path, rid)["attempts"][0]["tasks"]
    assert tasks["worker:1"]["exit_code"] == 1
    assert tasks["worker:0"]["exit_code"] != 0
    assert_nothing_left(slurm, rid)


# The evaluator fails at once; the workers go on until run.json says its failure was ignored.
EVALUATOR_FAILS = r"""
import json, os, sys, time
if os.environ["MGPU_TASK_TYPE"] == "evaluator":
    sys.exit(3)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with open(sys.argv[1]) as f:
            task = json.load(f)["attempts"][0]["tasks"]["evaluator:0"]
        if task.get("failure_ignored"):
            print("the evaluator's failure was ignored", flush=True)
            sys.exit(0)
    except (OSError, ValueError, KeyError, IndexError):
        pass
    time.sleep(0.1)
sys.exit(4)
"""


def test_a_failing_evaluator_leaves_the_step_running(slurm, tmp_path):
    """With an evaluator, srun runs without --kill-on-bad-exit: its failure ends neither the step
    nor the run."""
    rid = run_id("evaluator")
    script = tmp_path / "evaluator.py"
    script.write_text(EVALUATOR_FAILS)
    done = in_allocation(slurm, tmp_path, launch_argv(
        tmp_path, rid, "--evaluator", "--", sys.executable, str(script), str(tmp_path / "runs" / rid / "run.json")),
        tasks=3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "evaluator:0 exited with code 3; training goes on without it" in done.stdout + done.stderr
    record = run_record(tmp_path, rid)
    assert record["status"] == "succeeded"
    tasks = record["attempts"][0]["tasks"]
    assert (tasks["evaluator:0"]["exit_code"], tasks["evaluator:0"]["failure_ignored"]) == (3, True)
    assert [tasks[f"worker:{i}"]["exit_code"] for i in range(2)] == [0, 0]
    for i in range(2):
        assert "the evaluator's failure was ignored" in (tmp_path / "runs" / rid / f"worker-{i}.log").read_text()


# Prints until every task of the step runs (each leaves a file in DIR), then waits in silence.
SILENT_ONCE_ALL_RUN = r"""
import os, pathlib, sys, time
started = pathlib.Path(sys.argv[1])
(started / os.environ["SLURM_PROCID"]).touch()
def wait_for_data():
    time.sleep(600)
while len(list(started.iterdir())) < int(os.environ["SLURM_NTASKS"]):
    print("waiting for the other tasks", flush=True)
    time.sleep(0.1)
print("loading", flush=True)
wait_for_data()
"""


def test_a_silent_step_is_stopped_as_stalled_with_its_stacks(slurm, tmp_path):
    """Under Slurm only output counts as progress: tasks that print until all of them run, then wait
    in silence, are stopped once --stall-timeout passes, and the report says where each one was."""
    rid = run_id("stall")
    script = tmp_path / "silent.py"
    script.write_text(SILENT_ONCE_ALL_RUN)
    started = tmp_path / "started"
    started.mkdir()
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--stall-timeout", "2", "--",
                                                      sys.executable, str(script), str(started)))
    assert done.returncode == 1, done.stdout + done.stderr
    report = done.stderr[done.stderr.index("mgpu: error: "):].splitlines()
    assert report[0].startswith("mgpu: error: stall: no training task made progress for "), report
    for index in range(2):
        at = report.index(f"worker:{index} on {NODE}: in its own code, not in a collective")
        assert any(line.endswith(" in wait_for_data") and "silent.py:" in line for line in report[at:]), report
    assert report[-2] == f"stacks: {tmp_path / 'runs' / rid / 'stacks-0.txt'}"
    assert report[-1].startswith("hint: a program that computes for longer than 2 s without printing")
    assert "(no output; CPU use not measured)" in done.stdout + done.stderr  # Slurm's tasks' CPU is not counted
    assert run_record(tmp_path, rid)["status"] == "stalled"
    assert "wait_for_data" in (tmp_path / "runs" / rid / "stacks-0.txt").read_text()
    assert_nothing_left(slurm, rid)


def test_a_stopped_task_of_a_step_is_named_and_charged_with_the_stall(slurm, tmp_path):
    """Slurm's backend does not follow its tasks' state, so the stall's request for stacks, run on
    each task's node, also reads each process's state there: worker:1, stopped (SIGSTOP), is the one
    the others waited for."""
    rid = run_id("stopped")
    program = 'echo up; if [ "$SLURM_PROCID" = 1 ]; then kill -STOP $$; fi; exec sleep 60'
    done = in_allocation(slurm, tmp_path, launch_argv(tmp_path, rid, "--stall-timeout", "2", "--", "sh", "-c", program))
    assert done.returncode == 1, done.stdout + done.stderr
    attempt = run_record(tmp_path, rid)["attempts"][0]
    assert (attempt["cause"], attempt["task"], attempt["host"]) == ("stalled", "worker:1", NODE), done.stderr
    assert f"worker:1 on {NODE} is stopped (SIGSTOP, or a debugger)" in done.stdout + done.stderr
    assert_nothing_left(slurm, rid)


def test_asking_a_stalled_step_for_its_stacks_leaves_no_core_file(slurm, tmp_path):
    """With core dumps on in the tasks, the SIGABRT that asks for their stacks would leave a core file
    of every process in the task's folder: mgpu lowers their core limit to 0 first, on every node.
    Each task's child shell reads its own limit as the signal arrives (tests/programs/core_limit_task.py)."""
    rid = run_id("cores")
    program = pathlib.Path(__file__).parents[2] / "programs" / "core_limit_task.py"
    # MGPU_PY_SPY empty: no py-spy, so the stacks are asked for with SIGABRT, as where it cannot attach.
    done = in_allocation(slurm, tmp_path, ["env", "MGPU_PY_SPY=", *launch_argv(tmp_path, rid, "--stall-timeout", "2",
                                                                              "--", sys.executable, str(program))])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "mgpu: error: stall: no training task made progress for " in done.stderr, done.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    for index in range(2):
        assert f"limits-{index}.txt" in left, (left, done.stdout + done.stderr)
        limits = (tmp_path / f"limits-{index}.txt").read_text().split()
        assert limits[4] == "0", limits  # Max core file size <soft> <hard> bytes
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]
    assert_nothing_left(slurm, rid)


def test_the_gpus_slurm_binds_to_each_task_are_the_ones_it_gets(slurm, tmp_path):
    """A job holds GPU 0; an allocation with --gpus-per-task=1 then gets GPUs 1 and 2, one bound to
    each task of the step. Each task sees its own, as Slurm set it: not the plan's 0 and 1, nor the
    launcher's own CUDA_VISIBLE_DEVICES."""
    holder = slurm.run("sbatch", "--parsable", "--ntasks=1", "--gpus=1", "--time=10", "--output=/dev/null",
                       "--wrap", "exec sleep 600", cwd=tmp_path)
    assert holder.returncode == 0, holder.stderr
    job = holder.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 30
        while slurm.run("squeue", "-h", "-j", job, "-o", "%t").stdout.strip() != "R":
            assert time.monotonic() < deadline, "the job holding GPU 0 did not start: " + slurm.run("squeue").stdout
            time.sleep(0.2)
        rid = run_id("gpus")
        found = tmp_path / "env"
        found.mkdir()
        script = tmp_path / "env.py"
        script.write_text(ENV_WRITER)
        done = slurm.run("salloc", "--quiet", "--ntasks=2", "--gpus-per-task=1", "--time=10",
                         *launch_argv(tmp_path, rid, "--", sys.executable, str(script), str(found)),
                         env={**slurm.env, "CUDA_VISIBLE_DEVICES": "5"}, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        slurm.run("scancel", job)
    envs = [json.loads((found / f"env-{rank}.json").read_text()) for rank in range(2)]
    assert sorted(env["CUDA_VISIBLE_DEVICES"] for env in envs) == ["1", "2"]
    # A task with GPUs keeps JAX's own collectives.
    assert [env.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION") for env in envs] == [None, None]


STACKS_IN_A_STEP = """
set -u
{launch} >launch.out 2>&1 &
launch=$!
for _ in $(seq 600); do
    [ "$(cat runs/{rid}/worker-0.log runs/{rid}/worker-1.log 2>/dev/null | grep -c waiting)" = 2 ] && break
    sleep 0.1
done
{stacks} >stacks.out 2>stacks.err
echo "stacks-exit=$?"
touch go
wait $launch
echo "launch-exit=$?"
"""


def test_stacks_of_a_slurm_steps_tasks_are_read_on_their_node_and_the_run_then_succeeds(slurm, tmp_path):
    """`mgpu stacks` from the allocation's shell: py-spy runs in a step beside the tasks' (--overlap) and
    reads each task's processes by its rank; the run then ends as it would have."""
    rid = run_id("stacks")
    program = pathlib.Path(__file__).parents[2] / "programs" / "waits_for_go.py"
    launch = shlex.join(launch_argv(tmp_path, rid, "--", sys.executable, str(program), str(tmp_path / "go")))
    stacks = shlex.join([*MGPU, "stacks", rid, "--log-dir", str(tmp_path / "runs")])
    done = in_allocation(slurm, tmp_path, ["bash", "-c", STACKS_IN_A_STEP.format(launch=launch, rid=rid, stacks=stacks)])
    out = (tmp_path / "stacks.out").read_text()
    assert "stacks-exit=0" in done.stdout, done.stdout + (tmp_path / "stacks.err").read_text()
    for index in range(2):
        section = out.split(f"===== worker:{index} on {NODE} =====\n")[1].split("=====")[0]
        assert f"{program}:" in section and " in waits_for_go\n" in section, out
    assert "launch-exit=0" in done.stdout, (tmp_path / "launch.out").read_text()
    assert run_record(tmp_path, rid)["status"] == "succeeded"
    assert_nothing_left(slurm, rid)
