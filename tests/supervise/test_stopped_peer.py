"""A task stopped (SIGSTOP) while another fails waiting for it, as TensorFlow's coordination service
fails a chief whose peer sends no heartbeat: the attempt is charged `stalled` to the stopped task,
not `program-error` to the one that gave up on it."""

from __future__ import annotations

import json

from launching import finish, free_port, start_mgpu

# Each listens on its port (how mgpu sees it joined, and then samples it); worker:1 stops itself;
# worker:0 waits long enough for mgpu's samples (every 3 s: a quarter of the stall timeout) to see
# it stopped, then fails as a peer's heartbeat timeout would.
PROGRAM = ('import json, os, signal, socket, sys, time\n'
           'tf = json.loads(os.environ["TF_CONFIG"])\n'
           'index = tf["task"]["index"]\n'
           'server = socket.create_server(("127.0.0.1", int(tf["cluster"]["worker"][index].rsplit(":", 1)[1])))\n'
           'print("started", flush=True)\n'
           'if index == 1:\n'
           '    os.kill(os.getpid(), signal.SIGSTOP)\n'
           'time.sleep(5)\n'
           'sys.exit("worker:1 sent no heartbeat")\n')


def test_a_task_that_fails_waiting_for_a_stopped_one_charges_the_stopped_one(tmp_path):
    runs = tmp_path / "runs"
    program = tmp_path / "waits.py"
    program.write_text(PROGRAM)
    ports = ",".join(f"127.0.0.1:{free_port()}" for _ in range(2))
    proc = start_mgpu("launch", "--workers", ports, "--stall-timeout", "12", "--max-restarts", "0",
                      "--grace-period", "1", "--run-id", "stopped-peer", "--log-dir", str(runs), "--",
                      "python3", str(program))
    code, out = finish(proc, 60)
    assert code != 0, out
    first = json.loads((runs / "stopped-peer" / "run.json").read_text())["attempts"][0]
    assert (first["cause"], first["task"]) == ("stalled", "worker:1"), out[-3000:]
    assert "worker:1 was stopped (SIGSTOP" in first["detail"], first
