"""A remote rank's flight recorder, asked of its worker server where the rank runs: the server's
socket is on the task's host (flight_env.remote_socket_name), so a short program run there with
the tasks' Python (through the backend's run_beside: the run's SSH connection, a Slurm step) asks
it, as flight_recorder.ask_dump does here, and prints the answer between a marker line and the
end. Standard library only there; the answer is read here as untrusted and bounded."""

from __future__ import annotations

import os
import shlex

from launcher.plan.planner import TaskPlan
from launcher.supervise.attempt import AttemptTask

# The program run on the host: argv = socket, limit, timeout, marker. It removes the socket once
# answered: the stall is asked once, and the stop that follows kills the server without its cleanup.
ASK = """\
import http.client, os, socket, sys
path, limit, timeout, mark = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
out = sys.stdout.buffer
try:
    if not os.path.exists(path):
        raise OSError("no worker server's socket")
    c = C("localhost", timeout=timeout)
    c.request("POST", "/handler/fr_trace_json")
    r = c.getresponse()
    body = r.read(limit + 1)
    out.write(("%s %d\\n" % (mark, r.status)).encode())
    out.write(body)
except Exception as e:
    out.write(("%s error %s\\n" % (mark, type(e).__name__ + ": " + str(e))).encode())
finally:
    try:
        os.unlink(path)
    except OSError:
        pass
"""


def python_of(plan: TaskPlan) -> str:
    """The task's Python on its host (its argv[0], relative to its folder as it ran), else python3."""
    if plan.argv and os.path.basename(plan.argv[0]).startswith("python"):
        return plan.argv[0]
    return "python3"


def command(plan: TaskPlan, socket_name: str, limit: int, timeout: float, mark: str) -> str:
    return shlex.join([python_of(plan), "-c", ASK, socket_name, str(limit), f"{timeout:g}", mark])


def ask_remote_dump(task: AttemptTask, socket_name: str, limit: int, timeout: float, nonce: str) -> bytes | str:
    """The rank's recorder as its worker server answered on its host; or, as text, why not."""
    mark = f"mgpu-fr-{nonce}"
    ran = task.proc.run_beside(command(task.plan, socket_name, limit, timeout, mark), task.plan, timeout + 30,
                               limit + 4096)
    if ran.problem is not None:
        return f"no dump ({ran.problem})"
    head, sep, body = ran.out.partition(b"\n")
    words = head.decode("ascii", "replace").split(" ", 2)
    if not sep or words[0] != mark or len(words) < 2:
        return f"no dump (an unreadable answer, exit status {ran.status})"
    if words[1] == "error":
        return "no dump (" + (words[2] if len(words) > 2 else "?")[:200].encode("ascii", "backslashreplace").decode() + ")"
    if words[1] != "200":
        return f"its worker server answered HTTP {words[1][:10]}"
    if len(body) > limit:
        return f"its dump is over {limit >> 20} MiB"
    return body
