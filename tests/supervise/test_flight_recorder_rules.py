"""PyTorch's flight recorder, pure: what each task is given (the user's settings win, a task on
another host gets the buffer alone, a socket path too long for a Unix socket is not given) and the
analyzer's output read as untrusted text into a verdict."""

import pathlib

from launcher.plan.planner import TaskEnv, TaskPlan
from launcher.supervise import flight_env, fr_verdict

# What torch 2.13's fr_trace printed for a 2-rank gloo job whose rank 1 blocked in Python.
ANALYZED = b"""tabulate is not installed. Proceeding without it.
Not all ranks joining collective, sequence number: 11
internal record id: 10
group info: 0:default_pg
collective: gloo:all_reduce
missing ranks: {1}
input sizes: [[9]]
output sizes: [[9]]
world size: 2
expected ranks: {0, 1}
collective state: scheduled
collective stack trace: 
"""
TASK_OF = {0: "worker:0", 1: "worker:1"}


def plan(env):
    return TaskPlan(type="worker", index=0, host="127.0.0.1", port=1, local=True, ssh=None, argv=("python",), workdir=None, waits_for_ready=False,
                    env=TaskEnv({}, "{}", {}, env))


MEMBER = {"RANK": "1", "WORLD_SIZE": "2"}


def test_a_member_here_gets_the_buffer_the_dump_file_and_the_socket_in_the_run_dir():
    env = flight_env.start_env(plan(MEMBER), pathlib.Path("/runs/r1"), 2, {})
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/runs/r1/flight-recorder-2-rank-",
                   "TORCH_WORKER_SERVER_SOCKET": "/runs/r1/fr-2-1.sock"}


def test_the_users_settings_win_under_either_of_torchs_names():
    env = flight_env.start_env(plan({**MEMBER, "TORCH_NCCL_TRACE_BUFFER_SIZE": "10"}), pathlib.Path("/r"), 0,
                               {"TORCH_FR_DUMP_TEMP_FILE": "/mine/", "TORCH_WORKER_SERVER_SOCKET": "/s"})
    assert env == {}


def test_a_task_elsewhere_gets_the_buffer_alone_and_one_outside_the_job_nothing():
    assert flight_env.start_env(plan(MEMBER), None, 0, {}) == {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert flight_env.start_env(plan({}), pathlib.Path("/r"), 0, {}) == {}


def test_no_socket_where_its_path_is_too_long_for_one():
    env = flight_env.start_env(plan(MEMBER), pathlib.Path("/" + "d" * 100), 0, {})
    assert "TORCH_WORKER_SERVER_SOCKET" not in env and "TORCH_FR_BUFFER_SIZE" in env


def test_the_analyzers_verdict_names_the_task_that_did_not_join():
    verdict = fr_verdict.read(2, 0, ANALYZED, world=2)
    assert verdict.lines(TASK_OF) == ["flight recorder: worker:1 (rank 1) did not join gloo:all_reduce #11 "
                                      "(process group 0:default_pg), scheduled on the others"]
    assert verdict.to_dict(TASK_OF) == {"dumps": 2, "missing": [{
        "sequence": 11, "collective": "gloo:all_reduce", "group": "0:default_pg", "ranks": [1], "tasks": ["worker:1"],
        "state": "scheduled"}]}


def test_hostile_output_is_escaped_cut_and_ranks_outside_the_job_dropped():
    text = (b"Not all ranks joining collective, sequence number: 3\ncollective: \x1b[2Jevil" + b"x" * 500
            + b"\ngroup info: g\nmissing ranks: {1, 99}\n"
            + b"Not all ranks joining collective, sequence number: 4\ncollective: c\nmissing ranks: {77}\n"
            + b"Not all ranks joining collective, sequence number: 5\nmissing ranks: 1; rm -rf /\n")
    verdict = fr_verdict.read(2, 0, text, world=2)
    assert len(verdict.missing) == 1
    missing = verdict.missing[0]
    assert missing.ranks == (1,) and "\x1b" not in missing.collective and len(missing.collective) <= 130
    assert "\x1b" not in "".join(verdict.lines(TASK_OF))


def test_too_many_collectives_are_cut_and_a_huge_output_is_read_bounded():
    block = b"Not all ranks joining collective, sequence number: 1\ncollective: c\nmissing ranks: {0}\n"
    verdict = fr_verdict.read(2, 0, block * 100_000, world=2)
    assert len(verdict.missing) == fr_verdict.MAX_MISSING


def test_each_case_without_an_analysis_is_one_line():
    cases = [
        fr_verdict.read(2, 3, b"mgpu-fr: no torch\n", world=2),
        fr_verdict.read(0, 0, b"", world=2),
        fr_verdict.read(2, None, b"partial", world=2),
        fr_verdict.read(1, 0, b"We cannot decide what's wrong\n", world=2),
        fr_verdict.read(2, 1, b"Traceback ...\nKeyError: ('0', 0)\n", world=2),
    ]
    lines = [verdict.lines(TASK_OF) for verdict in cases]
    assert all(len(one) == 1 and one[0].startswith("flight recorder: ") for one in lines), lines
    assert "no torch" in lines[0][0] and "worker server" in lines[1][0] and "within its time" in lines[2][0]
    assert "only 1 of 2 ranks" in lines[3][0] and "exit 1" in lines[4][0] and "KeyError" in lines[4][0]
    assert fr_verdict.read(2, 0, b"nothing missing\n", world=2).lines(TASK_OF) == [
        "flight recorder: every rank joined every collective recorded (2 dumps)"]


def test_a_remote_rank_gets_its_worker_servers_socket_in_its_own_folder_there():
    assert flight_env.start_env(plan(MEMBER), None, 1, {}, run_id="r1") == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_WORKER_SERVER_SOCKET": ".mgpu-fr-r1-1-1.sock"}
    assert "TORCH_WORKER_SERVER_SOCKET" not in flight_env.start_env(plan(MEMBER), None, 1, {}, run_id="r" * 128)
    mine = {**MEMBER, "TORCH_WORKER_SERVER_SOCKET": "/run/me.sock"}
    assert "TORCH_WORKER_SERVER_SOCKET" not in flight_env.start_env(plan(mine), None, 1, {}, run_id="r1")
