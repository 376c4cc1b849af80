"""`mgpu launch --slurm` on a real one-node Slurm: each task's env in a step, and where its output lands."""

from __future__ import annotations

import json
import shlex
import sys
import time

from launcher.host.interfaces import interface_holding, local_addresses, source_address_toward
from slurm_helpers import MGPU, NODE, free_ports_in_a_row, in_allocation, launch_argv, program, run_id, run_record

NODE_INTERFACE = interface_holding([source_address_toward(NODE)], local_addresses())


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
