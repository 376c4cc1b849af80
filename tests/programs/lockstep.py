"""Workers that step in lockstep through files in a shared folder, as a collective would (a worker
whose peer is gone waits), worker 0 checkpointing each step; a restart resumes from the checkpoint.

Each worker listens on its TF_CONFIG port (how mgpu knows it joined) and first reaches every peer at
the address TF_CONFIG gives, as a collective would: a plan not made again for a spare sends it to a
lost host. In the run's first attempt the workers stop after step HOLD_AT and wait there (120 s at
most) as for a collective that a lost host never joins: the test loses hosts at a step it knows,
however fast or slow the machine, and the restart has steps left to resume.

Usage: python lockstep.py FOLDER TOTAL_STEPS HOLD_AT
"""

import json
import os
import pathlib
import socket
import sys
import time

folder, total, hold_at = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tf = json.loads(os.environ["TF_CONFIG"])
index, attempt = tf["task"]["index"], os.environ["MGPU_ATTEMPT"]
workers = tf["cluster"]["worker"]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(workers[index].rsplit(":", 1)[1])))
server.listen()
for address in workers[:index] + workers[index + 1:]:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(4)
            time.sleep(0.1)
checkpoint = folder / "step"
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
print(f"start step {start}", flush=True)
mine = folder / f"a{attempt}-w{index}"
peers = [folder / f"a{attempt}-w{i}" for i in range(len(workers)) if i != index]


def done(step):
    tmp = mine.with_suffix(".tmp")
    tmp.write_text(str(step))
    tmp.replace(mine)


done(start)  # read the checkpoint: worker 0 writes the next one only once every worker has read this
for step in range(start + 1, total + 1):
    for _ in range(1200):  # every peer's step before this one, 120 s at most
        if all(p.exists() and int(p.read_text() or 0) >= step - 1 for p in peers):
            break
        time.sleep(0.1)
    else:
        sys.exit(3)
    if index == 0:
        (folder / "step.tmp").write_text(str(step))
        (folder / "step.tmp").replace(checkpoint)
    done(step)
    print(f"MGPU_PROGRESS {step}/{total}", flush=True)
    if attempt == "0" and step == hold_at:
        time.sleep(120)  # the collective a lost host never joins; mgpu stops the attempt
        sys.exit(3)
print("done", flush=True)
