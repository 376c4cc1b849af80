"""The stall's `nvidia-smi -q` from a task's host: the script run with the task's PATH (a fake
nvidia-smi that prints a recorded query), a host without it, and its answer read as untrusted."""

import os
import pathlib

from launcher.host import beside_task, nvidia_smi
from launcher.supervise import gpu_state

FAKE_GPU_BIN = pathlib.Path(__file__).parents[1] / "programs" / "fake_gpu_bin"
RECORDED = (FAKE_GPU_BIN / "nvidia_smi_q.txt").read_text()


def ask(task_env, tmp_path):
    nonce = nvidia_smi.new_nonce()
    ran = beside_task.run_here(nvidia_smi.script(nonce), 10, nvidia_smi.answer_limit(), str(tmp_path), task_env)
    assert ran.problem is None and ran.status == 0, ran
    return nvidia_smi.parse_answer(ran.out, nonce)


def test_the_query_runs_with_the_tasks_path_and_is_kept_whole(tmp_path):
    answer = ask({"PATH": f"{FAKE_GPU_BIN}:{os.environ['PATH']}"}, tmp_path)
    assert answer == nvidia_smi.Query(True, 0, RECORDED)
    assert gpu_state.text_of(answer) == RECORDED


def test_a_host_without_nvidia_smi_says_so(tmp_path):
    assert ask({"PATH": "/nonexistent"}, tmp_path) == nvidia_smi.Query(False)


def test_a_failed_query_keeps_its_status_on_the_first_line(tmp_path):
    broken = tmp_path / "bin"
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate'\n"
                                       "exit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    answer = ask({"PATH": f"{broken}:{os.environ['PATH']}"}, tmp_path)
    assert gpu_state.text_of(answer) == ("# nvidia-smi -q exited with status 9\n"
                                         "NVIDIA-SMI has failed because it could not communicate\n")


def test_an_answer_is_read_only_after_its_own_marker_and_cut():
    nonce = "00ff"
    assert nvidia_smi.parse_answer(b"\x1emgpu-smi-other status 0\nGPU\n", nonce) is None
    assert nvidia_smi.parse_answer(b"garbage\x1emgpu-smi-00ff status 0\n", nonce) is None
    assert nvidia_smi.parse_answer(b"\x1emgpu-smi-00ff status 99999999999\n", nonce) is None
    long = b"\x1emgpu-smi-00ff status 0\n" + b"x" * (nvidia_smi.OUTPUT_LIMIT + 10)
    assert len(nvidia_smi.parse_answer(long, nonce).text) == nvidia_smi.OUTPUT_LIMIT


def test_each_host_gets_a_safe_file_name_of_its_own():
    taken: set[str] = set()
    assert gpu_state.file_name("node-1.cluster", taken) == "node-1.cluster.txt"
    assert gpu_state.file_name("../etc/passwd", taken) == "_etc_passwd.txt"
    assert gpu_state.file_name("node/1", taken) == "node_1.txt"
    assert gpu_state.file_name("node:1", taken) == "node_1-2.txt"
    assert gpu_state.file_name("", taken) == "host.txt"
