"""--host-agent: one SSH session per host runs the host's checks, then every task of it, in every
attempt (backends/ssh/agent.py, host_agent.py), against real sshd servers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal

import psutil
import pytest

import lab_mgpu
from launcher.backends.ssh.agent_task import STREAM_WINDOW
from launcher.backends.ssh.backend import SshBackend
from launcher.host import proctree
from launcher.host.ports import pick_free_ports
from launching import free_port, wait_for
from ssh_helpers import ECHO_PROGRAM, PYTHON, TRICKY, run_processes, unique_run_id
from ssh_tasks import _PER_LAUNCH, SESSION_COMMAND, drain, forced_host, plan

pytestmark = pytest.mark.ssh

# Worker 1 fails in the first attempt: the restart starts all four again through the agent.
FAILS_ONCE = ("import os, sys\n"
              "index, attempt = os.environ['MGPU_TASK_INDEX'], os.environ['MGPU_ATTEMPT']\n"
              "print('task', index, 'attempt', attempt, flush=True)\n"
              "sys.exit(3 if (index, attempt) == ('1', '0') else 0)\n")


def test_one_session_per_host_for_its_checks_and_every_task_and_none_at_a_restart(ssh_lab, tmp_path):
    """Four tasks on one host, one of which fails in the first attempt: sshd's ForceCommand counts
    one session for the checks, the four tasks and their restart (and one without the checks)."""
    sessions = tmp_path / "sessions"
    # Each session's line names its command's start: what opened a session it should not have.
    force = (f'echo session "$(printf %s "$SSH_ORIGINAL_COMMAND" | head -c 300 | tr "\\n" " ")" >> {sessions}; '
             'eval "$SSH_ORIGINAL_COMMAND"')
    with forced_host(ssh_lab, tmp_path, "counted", force) as (known, config):
        for checks in ([], ["--no-check"]):  # without the checks, the agent has a session of its own
            ports = pick_free_ports(4)
            sessions.write_text("")
            proc = lab_mgpu.start(tmp_path, "launch", "--workers", ",".join(f"counted:{p}" for p in ports), *checks,
                                  "--host-agent", "--max-restarts", "1", "--ssh-config", str(config),
                                  "--known-hosts", str(known), "--connect-timeout", "5",
                                  "--run-id", unique_run_id("agent"), "--", PYTHON, "-c", FAILS_ONCE)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            for index in range(4):
                for attempt in range(2):
                    assert f"task {index} attempt {attempt}" in out.decode(), out.decode() + err.decode()
            assert sessions.read_text().count("session") == 1, (checks, sessions.read_text(), err.decode())


# 1 MiB on stdout and 250 KiB on stderr, each task its own bytes, in blocks of 4 KiB and 1000 bytes.
FLOOD = ("import hashlib, sys\n"
         "for n in range(256):\n"
         "    block = hashlib.sha256(b'%s %d' % (sys.argv[1].encode(), n)).digest() * 128\n"
         "    sys.stdout.buffer.write(block); sys.stderr.buffer.write(block[:1000])\n")


def flood_of(index: int) -> tuple[bytes, bytes]:
    blocks = [hashlib.sha256(b"%d %d" % (index, n)).digest() * 128 for n in range(256)]
    return b"".join(blocks), b"".join(block[:1000] for block in blocks)


def test_eight_flooding_tasks_on_one_host_arrive_byte_exact_each_waiting_on_its_own_host(ssh_lab):
    """Eight tasks flood one host's agent; task 0 is not read until the others have ended: they are
    not held up by it, it waits on its host with at most its window unread here, and then every
    byte of every task arrives, stdout and stderr apart. A task's arguments and variables arrive
    byte-exact, a signal reaches its group, and closing the backend ends what is left (the hang-up
    guard), a process that left the task's group too."""
    run_id = unique_run_id("agent-flood")
    backend = SshBackend(ssh_lab.options(host_agent=True))
    try:
        procs = [backend.start(plan("sshd-a", [PYTHON, "-c", FLOOD, str(i)], run_id=run_id, index=i), 0)
                 for i in range(8)]
        for i, proc in enumerate(procs[1:], 1):
            assert drain(proc) == flood_of(i), f"task {i}"
            assert wait_for(lambda: proc.poll() is not None, 10) and proc.poll() == 0
        assert procs[0].poll() is None, "task 0 ended though its output was not read"
        assert 0 < procs[0].unread() <= 2 * STREAM_WINDOW
        assert drain(procs[0]) == flood_of(0)
        assert wait_for(lambda: procs[0].poll() is not None, 10) and procs[0].poll() == 0

        echo = backend.start(plan("sshd-a", [PYTHON, "-c", ECHO_PROGRAM, *TRICKY], {"TRICKY": TRICKY[5] + TRICKY[7]},
                                  run_id=run_id, index=8), 0)
        seen = json.loads(drain(echo)[0])
        assert seen["argv"] == TRICKY
        env = backend.start(plan("sshd-a", [PYTHON, "-c", "import os; print(repr(os.environ['TRICKY']))"],
                                 {"TRICKY": TRICKY[5] + TRICKY[7]}, run_id=run_id, index=9), 0)
        assert drain(env)[0].decode().strip() == repr(TRICKY[5] + TRICKY[7])

        missing = backend.start(plan("sshd-a", ["/nonexistent/program"], run_id=run_id, index=12), 0)
        out, err = drain(missing)
        # Its exit status is a frame of its own, after its streams' ends.
        assert wait_for(lambda: missing.poll() is not None, 10), err
        assert missing.poll() == 127 and b"/nonexistent/program: No such file or directory" in err, err

        # The join reporter's duties: a task that listens on its port has joined; its CPU use is
        # sampled; a stopped task is said to be stopped, and then running again.
        port = free_port()
        listens = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %d)); s.listen(); "
                   "print('up', flush=True); time.sleep(60)" % port)
        sleeper = backend.start(dataclasses.replace(plan("sshd-a", [PYTHON, "-c", listens], run_id=run_id, index=10),
                                                    port=port), 0)
        assert sleeper.stdout.readline() == b"up\n"
        assert wait_for(lambda: sleeper.joined(port, None), 10)
        assert wait_for(sleeper.usage, 10).cpu_seconds > 0
        sleeper.signal_tree(signal.SIGSTOP)
        assert wait_for(lambda: sleeper.stopped() is True, 10)
        sleeper.signal_tree(signal.SIGCONT)
        assert wait_for(lambda: sleeper.stopped() is False, 10)
        sleeper.signal_tree(signal.SIGTERM)
        assert wait_for(lambda: sleeper.poll() is not None, 10) and sleeper.poll() == -signal.SIGTERM

        # A task with a child in a session of its own: only the task's tags find it.
        left = backend.start(plan("sshd-a", ["/bin/sh", "-c", "setsid sleep 60 & echo started; exec sleep 60"],
                                  run_id=run_id, index=11), 0)
        assert left.stdout.readline() == b"started\n"
        assert wait_for(lambda: len(run_processes(run_id)) >= 2, 10)
    finally:
        backend.close()
    assert wait_for(lambda: not run_processes(run_id), 20), run_processes(run_id)


def test_a_task_the_agent_starts_gets_what_a_session_of_its_own_gives_it(ssh_lab, tmp_path):
    """The agent (here after the checks, in a --workdir) starts a task with the environment, folder,
    signal dispositions and process group a session of its own gives it (--no-host-agent and
    --no-check: one session per task)."""
    for workdir in ([], ["--workdir", str(tmp_path)]):
        seen = {}
        for mode in (["--host-agent"], ["--no-host-agent", "--no-check"]):
            (port,) = pick_free_ports(1)
            result = lab_mgpu.run(tmp_path, "launch", "--workers", f"sshd-a:{port}", *mode, *workdir,
                                  *lab_mgpu.ssh_files(ssh_lab), "--connect-timeout", "5",
                                  "--run-id", unique_run_id("agent-session"), "--", *SESSION_COMMAND)
            assert result.returncode == 0, result.stderr
            line = next(line for line in result.stdout.splitlines() if "SESSION " in line)
            seen[mode[0]] = json.loads(line.split("SESSION ", 1)[1])
        by_agent, own = seen["--host-agent"], seen["--no-host-agent"]
        for name in _PER_LAUNCH | {"TORCH_WORKER_SERVER_SOCKET"}:  # the worker server's socket: named after the run
            by_agent["env"].pop(name, None), own["env"].pop(name, None)
        assert {k: (v, own["env"].get(k)) for k, v in by_agent["env"].items() if own["env"].get(k) != v} == {}
        assert by_agent == own, workdir
        home = os.path.expanduser("~" + ssh_lab.user)
        assert by_agent["leader"] and by_agent["cwd"] == (workdir[1] if workdir else home)


def test_the_agent_is_shipped_as_one_source_of_the_standard_library():
    """What a host runs: host_agent_proc.py and host_agent.py as one source, importing nothing of mgpu."""
    from launcher.backends.ssh.agent import agent_source

    source = agent_source().decode()
    compile(source, "mgpu-host-agent", "exec")
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports and not [line for line in imports if "launcher" in line], imports


def test_a_checks_session_handed_over_to_a_host_whose_agent_runs_already_ends(ssh_lab, tmp_path):
    """The --setup starts a host's agent before the checks: the session the checks then hand over
    starts nothing and ends at the host's next task, not with the run."""
    from launcher.preflight.check import check_hosts_and_reach, handovers_of
    from ssh_tasks import kept_shells

    run_id = unique_run_id("agent-there")
    backend = SshBackend(ssh_lab.options())
    try:
        setup = backend.start(plan("sshd-a", [PYTHON, "-c", "print('setup')"], run_id=run_id, index=1), 0)
        assert drain(setup)[0] == b"setup\n"
        task = dataclasses.replace(plan("sshd-a", [PYTHON, "-c", "print('task')"], run_id=run_id,
                                        workdir=str(tmp_path)), port=free_port())
        reports, _, _ = check_hosts_and_reach([task], [task], backend, handover=True)
        assert reports[0].ok, reports[0].reason
        backend.take_handovers(handovers_of(reports))
        assert kept_shells(tmp_path)
        proc = backend.start(task, 0)
        assert drain(proc)[0] == b"task\n"
        assert wait_for(lambda: not kept_shells(tmp_path), 20), "the handed-over session still waits"
    finally:
        backend.close()


def test_a_hang_up_ends_the_agent_once_its_tasks_end_not_after_their_grace_period(ssh_lab):
    """The launcher's connection closes: the task gets SIGTERM and ends at once, and the agent exits
    then, though the grace period it would give a task that does not end is two minutes."""
    backend = SshBackend(ssh_lab.options(host_agent=True), grace_period=120)
    try:
        program = "import os, time; print(os.getpid(), os.getppid(), flush=True); time.sleep(120)"
        proc = backend.start(plan("sshd-a", [PYTHON, "-c", program], run_id=unique_run_id("agent-hang-up")), 0)
        task, agent = (psutil.Process(int(pid)) for pid in proc.stdout.readline().split())
        assert "mgpu-host-agent" in " ".join(agent.cmdline())
    finally:
        backend.close()
    wait_for(lambda: not proctree.is_alive(task), 60, what="the task to end")
    wait_for(lambda: not proctree.is_alive(agent), 60, what="the agent to exit")
