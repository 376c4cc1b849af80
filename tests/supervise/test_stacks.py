"""Where stalled tasks are, from faulthandler's dumps: pure text, no processes."""

import pathlib

from launcher.supervise import stacks
from launcher.supervise.diagnosis import TaskLine
from launcher.supervise.stall import StallClock
from launcher.supervise.summary import TaskView, stall_summary

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"

WAITING_IN_TF = [
    "step 3 done",
    "Fatal Python error: Aborted",
    "",
    "Thread 0x00007f1 (most recent call first):",
    f'  File "{STDLIB}/threading.py", line 327 in wait',
    f'  File "{STDLIB}/threading.py", line 1002 in _bootstrap',
    "",
    "Current thread 0x00007f2 (most recent call first):",
    f'  File "{SITE}/tensorflow/python/eager/execute.py", line 53 in quick_execute',
    f'  File "{SITE}/tensorflow/python/util/traceback_utils.py", line 150 in error_handler',
    '  File "/home/me/train.py", line 40 in main',
    '  File "/home/me/train.py", line 45 in <module>',
    "",
    "Extension modules: numpy._core._multiarray_umath (total: 1)",
]
BLOCKED_IN_OWN_CODE = [
    "step 3: loading",
    "Fatal Python error: Aborted",
    "",
    "Current thread 0x00007f3 (most recent call first):",
    f'  File "{STDLIB}/threading.py", line 327 in wait',
    f'  File "{STDLIB}/threading.py", line 629 in wait',
    '  File "/home/me/train.py", line 22 in next_batch',
    '  File "/home/me/train.py", line 40 in main',
    '  File "/home/me/train.py", line 45 in <module>',
]


def view(name: str, lines: list[str]) -> TaskView:
    tail = [TaskLine(line, stderr=True) for line in lines]  # faulthandler writes to stderr
    return TaskView(name, "h1", 2222, False, tail, pathlib.Path(f"/runs/{name}.log"))


def test_the_main_thread_says_where_a_task_is():
    waiting = stacks.whereabouts(WAITING_IN_TF)
    assert waiting.framework == "tensorflow" and str(waiting.frames[0]).startswith("tensorflow/python/eager/execute.py:53")
    blocked = stacks.whereabouts(BLOCKED_IN_OWN_CODE)
    assert blocked.in_own_code and blocked.frames[2].function == "next_batch"
    assert stacks.whereabouts(["no dump here", "Traceback (most recent call last):"]) is None


def test_the_task_in_its_own_code_is_named_while_the_others_wait_in_the_framework():
    text = stall_summary("stall: no training task made progress for 60 s",
                         [view("worker:0", WAITING_IN_TF), view("worker:1", BLOCKED_IN_OWN_CODE)],
                         pathlib.Path("/runs/stacks-0.txt"))
    assert text.splitlines() == [
        "stall: no training task made progress for 60 s; likely cause: worker:1, in its own code while the others wait",
        "worker:0 on h1: waiting in tensorflow",
        "  tensorflow/python/eager/execute.py:53 in quick_execute",
        "  /home/me/train.py:40 in main",
        "  /home/me/train.py:45 in <module>",
        "worker:1 on h1: in its own code, not in a collective",
        f"  {STDLIB}/threading.py:327 in wait",
        "  /home/me/train.py:22 in next_batch",
        "  /home/me/train.py:40 in main",
        "  /home/me/train.py:45 in <module>",
        "stacks: /runs/stacks-0.txt",
    ]


def test_every_task_in_the_framework_and_tasks_without_a_stack():
    text = stall_summary("stall", [view("worker:0", WAITING_IN_TF), view("worker:1", WAITING_IN_TF),
                                   view("worker:2", ["a shell script"])], pathlib.Path("/s"))
    lines = text.splitlines()
    assert lines[0] == "stall; every task waits inside the framework (a hang in it, or the network between the tasks)"
    assert lines[-2].startswith("worker:2 on h1: no Python stack (not a Python program, or faulthandler turned off)")


def test_dump_lines_keep_only_the_dumps():
    kept = stacks.dump_lines(["before", *BLOCKED_IN_OWN_CODE[1:], "after the dump"])
    assert kept[0] == "Fatal Python error: Aborted" and "before" not in kept and "after the dump" not in kept
    assert '  File "/home/me/train.py", line 22 in next_batch' in kept


def test_the_stall_clock():
    clock = StallClock(timeout=60, now=0)
    assert clock.cpu_sample_interval == 10
    clock.cpu_sample("w0", 5.0, now=0)
    clock.cpu_sample("w0", 5.5, now=10)  # 5 % of a core: waiting, not working
    assert clock.activity_at == 0
    clock.cpu_sample("w0", 7.5, now=20)  # 20 %: working
    assert clock.activity_at == 20 and not clock.stalled(79)
    clock.output_seen(30)
    assert not clock.stalled(89) and clock.stalled(90) and clock.idle_for(95) == 65


IN_LIGHTNING = [
    "Fatal Python error: Aborted",
    "",
    "Current thread 0x00007f4 (most recent call first):",
    f'  File "{STDLIB}/threading.py", line 327 in wait',
    f'  File "{SITE}/lightning/fabric/utilities/distributed.py", line 290 in _init_dist_connection',
    f'  File "{SITE}/lightning/pytorch/trainer/trainer.py", line 561 in fit',
    '  File "/home/me/train.py", line 30 in <module>',
]


def test_a_task_is_in_its_own_code_only_where_a_frame_of_its_own_shows_it():
    """A main thread inside another installed package (Lightning) waits there; no frame at all is no stack."""
    assert stacks.whereabouts(IN_LIGHTNING).framework == "lightning"
    text = stall_summary("stall", [view("worker:0", WAITING_IN_TF), view("worker:1", IN_LIGHTNING)], pathlib.Path("/s"))
    assert "likely cause" not in text.splitlines()[0]
    assert "worker:1 on h1: waiting in lightning" in text.splitlines()
    frameless = ["Fatal Python error: Aborted", "", "Current thread 0x00007f5 (most recent call first):",
                 "  <no Python frame>"]
    assert stacks.whereabouts(frameless) is None


def test_a_task_that_had_ended_is_said_to_have_ended_and_a_hint_names_the_stall_timeout():
    ended = TaskView("chief:0", "h0", 2222, False, [], pathlib.Path("/runs/chief-0.log"), returncode=0, ended_at=100.0)
    late = TaskView("worker:0", "h1", 2222, False, [], pathlib.Path("/runs/w.log"), returncode=-6, ended_at=200.0)
    lines = stall_summary("stall", [ended, late], pathlib.Path("/s"), stall_timeout=60, stopped_at=150.0).splitlines()
    assert "chief:0 on h0: exited with code 0 before the stall" in lines
    assert not any(line.startswith("chief:0 on h0: no Python stack") for line in lines)
    assert any(line.startswith("worker:0 on h1: no Python stack") for line in lines)  # stopped by the watchdog
    assert lines[-1] == ("hint: a program that computes for longer than 60 s without printing is not stalled: "
                         "give --stall-timeout a longer time (0: no stall watch), or print progress")
