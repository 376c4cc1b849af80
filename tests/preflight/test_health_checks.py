"""What a host's health check says, read as untrusted text: the built-in GPU checks on nvidia-smi's
answers (recorded here in the CSV form `nvidia-smi --query-gpu=... --format=csv` prints: no GPU
runs these tests), and the user's check's exit code and last lines."""

from launcher.preflight.health import COMMAND_MARK, QUERY_MARK, gpu_problems, judge, last_lines

HEALTHY_H100 = f"""{QUERY_MARK}memory
index, ecc.errors.uncorrected.volatile.total, retired_pages.pending, remapped_rows.failure
0, 0, [N/A], No
1, 0, [N/A], No
{QUERY_MARK}recovery
index, gpu_recovery_action
0, None
1, None
"""

# A V100 with a double-bit error and a page to retire; an A100 whose row remapping failed and that
# asks for a reset.
SICK = f"""{QUERY_MARK}memory
index, ecc.errors.uncorrected.volatile.total, retired_pages.pending, remapped_rows.failure
0, 2, Yes, [N/A]
1, 0, [N/A], Yes
{QUERY_MARK}recovery
index, gpu_recovery_action
0, None
1, Reset
"""

# An older driver that knows no gpu_recovery_action: nvidia-smi's error goes to /dev/null, its
# query prints nothing; ECC off on a consumer GPU.
OLD_DRIVER = f"""{QUERY_MARK}memory
index, ecc.errors.uncorrected.volatile.total, retired_pages.pending, remapped_rows.failure
0, [N/A], [N/A], [N/A]
{QUERY_MARK}recovery
"""


def test_healthy_gpus_and_an_old_driver_say_nothing():
    assert gpu_problems(HEALTHY_H100) == []
    assert gpu_problems(OLD_DRIVER) == []
    assert gpu_problems("") == []  # no nvidia-smi on the host


def test_sick_gpus_are_named_one_problem_a_line():
    assert gpu_problems(SICK) == [
        "GPU 0: 2 uncorrectable ECC error(s) since the driver loaded",
        "GPU 0: pages waiting to be retired (a reset or reboot retires them)",
        "GPU 1: a row remapping failed (the retired-page limit is reached)",
        "GPU 1: the driver asks for a recovery action: Reset",
    ]


def test_what_is_not_nvidia_smis_answer_is_not_read():
    other = f"{QUERY_MARK}memory\nFailed to initialize NVML: Driver/library version mismatch\n0, 5, Yes, Yes\n"
    assert gpu_problems(other) == []
    escape = f"{QUERY_MARK}recovery\nindex, gpu_recovery_action\n\x1b[2J0, \x1b]0;x\x07Reboot\n"
    (problem,) = gpu_problems(escape)
    assert "\x1b" not in problem and "\x07" not in problem
    many = f"{QUERY_MARK}memory\nindex, ecc.errors.uncorrected.volatile.total, retired_pages.pending, " \
           "remapped_rows.failure\n" + "0, 1, No, No\n" * 100000
    assert len(gpu_problems(many)) < 2000  # bounded, whatever the host sends


def test_a_check_fails_on_its_exit_code_naming_its_last_lines():
    out = f"{COMMAND_MARK}\nstarting\n".encode()
    err = b"line 1\nline 2\n\nNCCL test: bus bandwidth 3 GB/s \x1b[31mtoo low\x1b[0m\n" + b"x" * 500 + b"\n"
    why = judge(3, f"{HEALTHY_H100}".encode() + out, err)
    assert why.startswith("the health check exited with code 3: line 2 | NCCL test: bus bandwidth 3 GB/s ")
    assert "\x1b" not in why and why.endswith("x" * 200 + "...")
    assert judge(0, HEALTHY_H100.encode() + out, err) is None
    assert judge(1, f"{COMMAND_MARK}\nonly stdout\n".encode(), b"") == "the health check exited with code 1: only stdout"
    assert last_lines(b"", b"") == "no output"


def test_sick_gpus_fail_a_check_that_exits_0():
    why = judge(0, SICK.encode() + f"{COMMAND_MARK}\n".encode(), b"")
    assert why.startswith("GPU 0: 2 uncorrectable ECC error(s)") and why.endswith("recovery action: Reset")


def test_gpu_memory_still_held_after_an_attempt_fails_the_host():
    held = f"""{QUERY_MARK}held
pid, process_name, used_gpu_memory [MiB]
48213, /opt/venv/bin/python3, 71234 MiB
{QUERY_MARK}memory
index, ecc.errors.uncorrected.volatile.total, retired_pages.pending, remapped_rows.failure
0, 0, [N/A], No
"""
    assert gpu_problems(held) == ["GPU memory still held 30 s after the attempt: process 48213 "
                                  "(/opt/venv/bin/python3, 71234 MiB)"]
    assert gpu_problems(f"{QUERY_MARK}held\npid, process_name, used_gpu_memory [MiB]\n") == []  # freed in time
