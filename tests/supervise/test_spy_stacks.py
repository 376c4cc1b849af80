"""py-spy's answers read as untrusted text, and where a task is from them (native frames too): pure."""

import json

from launcher.host import py_spy
from launcher.host.py_spy import Answer, Dump
from launcher.supervise import spy_stacks
from launcher.supervise.summary import TaskView, stall_summary

SITE = "/venv/lib/python3.11/site-packages"


def frame(name, filename, line=0, native=False):
    return {"name": name, "filename": filename, "line": line, "module": filename if native else None}


def dump(pid, *threads):
    return Dump(pid, 0, json.dumps([{"thread_name": name, "os_thread_id": pid, "frames": frames}
                                    for name, frames in threads]))


WAITING_IN_GLOO = dump(11, ("MainThread", [
    frame("__futex_abstimed_wait_common", "/usr/lib/x86_64-linux-gnu/libc.so.6", native=True),
    frame("gloo::transport::tcp::UnboundBuffer::waitRecv", f"{SITE}/torch/lib/libtorch_cpu.so", native=True),
    frame("allreduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2806),
    frame("train_step", "/home/me/train.py", 30),
    frame("<module>", "/home/me/train.py", 50),
]))
SLEEPING_IN_OWN_CODE = dump(12, ("Thread-1", [frame("wait", "/usr/lib/python3.11/threading.py", 327)]), ("MainThread", [
    frame("clock_nanosleep", "/usr/lib/x86_64-linux-gnu/libc.so.6", native=True),
    frame("time_sleep", "/usr/lib/libpython3.11.so.1.0", native=True),
    frame("next_batch", "/home/me/train.py", 12),
    frame("<module>", "/home/me/train.py", 50),
]))


def test_native_frames_count_where_they_are_the_frameworks_and_not_where_libc_waits_for_python():
    waiting = spy_stacks.read("worker:0", "h1", Answer("/bin/py-spy", (WAITING_IN_GLOO,))).whereabouts()
    assert waiting.framework == "torch"
    sleeping = spy_stacks.read("worker:1", "h2", Answer("/bin/py-spy", (SLEEPING_IN_OWN_CODE,))).whereabouts()
    assert sleeping.in_own_code and sleeping.frames[2].function == "next_batch"


def test_the_stall_report_names_the_task_the_others_wait_for_from_py_spys_stacks():
    spied = {"worker:0": spy_stacks.read("worker:0", "h1", Answer("s", (WAITING_IN_GLOO,))).whereabouts(),
             "worker:1": spy_stacks.read("worker:1", "h2", Answer("s", (SLEEPING_IN_OWN_CODE,))).whereabouts()}
    views = [TaskView(name, host, None, False, [], f"/runs/{name}.log") for name, host in (("worker:0", "h1"),
                                                                                              ("worker:1", "h2"))]
    report = stall_summary("stall", views, "/runs/stacks-0.txt", spied=spied, bundle="/runs/stall-0").splitlines()
    assert report[0] == "stall; likely cause: worker:1, in its own code while the others wait"
    assert "worker:0 on h1: waiting in torch" in report
    at = report.index("worker:1 on h2: in its own code, not in a collective")
    assert report[at + 1] == "  /usr/lib/x86_64-linux-gnu/libc.so.6 in clock_nanosleep"
    assert report[at + 2] == "  /home/me/train.py:12 in next_batch"
    assert report[-2:] == ["evidence: /runs/stall-0/ (its README says what is there)", "stacks: /runs/stacks-0.txt"]


def test_an_answer_is_read_only_between_its_own_marker_lines():
    nonce = "0123abcd"
    mark = f"\x1emgpu-spy-{nonce} "
    forged = "\x1emgpu-spy-ffffffff pid 1 0 0\n"  # another nonce: part of the dump's text
    out = (f"login banner\n{mark}scope 1\n{mark}uid 1000\n{mark}spy /usr/bin/py-spy\n{mark}pid 42 0 1000\n[]\n"
           f"{mark}pid 43 1 1001\nError: Permission denied (os error 13)\n{forged}{mark}pid x 0 0\nafter\n"
           f"{mark}end\ntrailing\n").encode()
    answer = py_spy.parse_answer(out, nonce)
    assert (answer.spy, answer.ptrace_scope, answer.uid) == ("/usr/bin/py-spy", 1, 1000)
    assert [(d.pid, d.status, d.owner) for d in answer.dumps] == [(42, 0, 1000), (43, 1, 1001)]
    assert "ffffffff" in answer.dumps[1].text and "after" not in answer.dumps[1].text
    assert py_spy.parse_answer(f"{mark}scope -\n{mark}missing\n".encode(), nonce) == Answer(None)


def test_each_process_state_is_read_with_or_without_py_spy_and_only_as_one_letter():
    nonce = "0123abcd"
    mark = f"\x1emgpu-spy-{nonce} "
    states = (f"{mark}state 42 T\n{mark}state 43 S\n{mark}state 44 \n{mark}state 45 TT\n{mark}state x T\n"
              f"\x1emgpu-spy-ffffffff state 46 T\n")
    answer = py_spy.parse_answer(f"{mark}scope -\n{states}{mark}missing\n".encode(), nonce)
    assert answer.spy is None and answer.states == ((42, "T"), (43, "S")) and answer.stopped()
    running = py_spy.parse_answer(f"{mark}state 43 S\n{mark}spy /usr/bin/py-spy\n{mark}end\n".encode(), nonce)
    assert not running.stopped()
    assert spy_stacks.read("worker:1", "h2", answer).stopped and not spy_stacks.read("worker:1", "h2", running).stopped


def test_hostile_or_cut_json_is_no_stack_and_no_crash():
    for text in ("[" * 100000, "{}", '[{"frames": "x"}]', '[{"frames": [{"name": 1}]}]', "[" + "1," * 10 + "1]",
                 '[{"frames": [{"name": "f", "filename": "x", "line": true}]}]', "x" * py_spy.DUMP_LIMIT):
        read = spy_stacks.read("worker:0", "h", Answer("s", (Dump(5, 0, text),)))
        assert read.processes in ((), (spy_stacks.ProcessStacks(5, ()),)) or all(
            not t.frames for p in read.processes for _, t in p.threads), text[:40]
    escaped = spy_stacks.read("worker:0", "h", Answer("s", (Dump(5, 2, "Error: \x1b[2J boom\n"),)))
    assert escaped.problem == "worker:0 on h: py-spy could not read pid 5: Error: \\x1b[2J boom"


def test_what_each_refusal_or_absence_says_in_one_line():
    refused = spy_stacks.read("worker:1", "h2", Answer("s", (Dump(9, 1, "Error: Operation not permitted (os error 1)",
                                                                  1000),), ptrace_scope=1, uid=1000))
    assert refused.refused and not refused.collected
    assert refused.problem == (
        "worker:1 on h2: py-spy may not attach to pid 9 (kernel.yama.ptrace_scope is 1): run the tasks as mgpu's "
        "user, set `sysctl kernel.yama.ptrace_scope=0` there, or give the container SYS_PTRACE "
        "(docker run --cap-add SYS_PTRACE)")
    missing = spy_stacks.read("worker:0", "h1", Answer(None))
    assert missing.problem == ("worker:0 on h1: no py-spy there (pip install py-spy (in the tasks' environment or "
                               "on PATH); or set MGPU_PY_SPY)")
    shell_only = spy_stacks.read("worker:0", "h1", Answer("s", (Dump(3, 1, "Error: Failed to find python version"),)))
    assert shell_only.problem == "worker:0 on h1: no Python process of the task was found running"
    late = spy_stacks.read("worker:0", "h1", Answer("s", (Dump(3, py_spy.TIMED_OUT, ""),)))
    assert late.problem == "worker:0 on h1: py-spy did not read pid 3 within its time"
