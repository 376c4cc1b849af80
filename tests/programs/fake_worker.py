"""A stand-in for a training task, steered by flags. Task selectors are names
like "worker:1" ("worker:1@0" = only in attempt 0) or "all"."""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

TYPE = os.environ.get("MGPU_TASK_TYPE", "?")
INDEX = os.environ.get("MGPU_TASK_INDEX", "?")
NAME = f"{TYPE}:{INDEX}"
ATTEMPT = os.environ.get("MGPU_ATTEMPT", "?")
SLEEPER = (
    "import os, sys, time\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "while True: time.sleep(1)\n"
)
# A process that left the run: its own session, no MGPU_RUN_ID, its parent gone.
# It keeps the task's stdout and stderr open for a minute.
ESCAPED_HOLDER = (
    "import os, sys, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(60)\n"
)


def selected(selectors):
    for sel in selectors:
        name, _, attempt = sel.partition("@")
        if name in ("all", NAME, TYPE) and (not attempt or attempt == ATTEMPT):
            return True
    return False


def text_for(specs, default):
    """The value of the first SELECTOR=VALUE of `specs` that selects this task."""
    for spec in specs:
        sel, _, value = spec.partition("=")
        if selected([sel]):
            return value
    return default


def value_for(specs, default):
    value = text_for(specs, None)
    return default if value is None else float(value)


def cluster_address(name):
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    task_type, _, index = name.partition(":")
    host, _, port = cluster[task_type][int(index)].rpartition(":")
    return host, int(port)


def wait_until_listened_on(port):
    """Until something listens on `port` (bounded: 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    sys.exit(f"{NAME}: nothing listened on port {port} in 60 s")


def wait_for_pid_file(pid_file):
    for _ in range(200):  # wait (bounded) until it runs, so a test can find it
        if os.path.exists(pid_file) and os.path.getsize(pid_file):
            return
        time.sleep(0.01)


def spawn_sleeper(pid_file, new_session):
    subprocess.Popen([sys.executable, "-c", SLEEPER, pid_file], start_new_session=new_session)
    wait_for_pid_file(pid_file)


def spawn_escaped_holder(pid_file):
    subprocess.run([sys.executable, "-c", ESCAPED_HOLDER, pid_file], env={}, check=True)
    wait_for_pid_file(pid_file)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", help="directory: write this task's env and argv to <type>-<index>.attempt<N>.json")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--sleep-on", action="append", default=[], help="SELECTOR=SECONDS")
    ap.add_argument("--forever", action="store_true", help="run until killed (except tasks given --sleep-on)")
    ap.add_argument("--busy", action="append", default=[], help="tasks that use the CPU while they wait, silently")
    ap.add_argument("--tick", action="append", default=[], help="tasks that print a line every 0.2 s while they wait")
    ap.add_argument("--until-file", help="wait until this file exists (at most 60 s) instead of --sleep")
    ap.add_argument("--after-file", action="append", default=[],
                    help="SELECTOR=PATH: the task waits for PATH to exist (at most 60 s) before anything else")
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--fail", action="append", default=[], help="SELECTOR=CODE")
    ap.add_argument("--ready", action="store_true", help="print the readiness line")
    ap.add_argument("--no-ready", action="append", default=[])
    ap.add_argument("--ignore-term", action="append", default=[])
    ap.add_argument("--grandchild", action="append", default=[])
    ap.add_argument("--setsid-grandchild", action="append", default=[])
    ap.add_argument("--escaped-holder", action="append", default=[],
                    help="leave a process outside the run holding this task's output open")
    ap.add_argument("--print-mb", type=float, default=0.0)
    ap.add_argument("--lines", type=int, default=0)
    ap.add_argument("--bind", action="store_true", help="listen on this task's TF_CONFIG port, like a TF server")
    ap.add_argument("--no-bind", action="append", default=[], help="with --bind: tasks that do not listen")
    ap.add_argument("--dial", action="append", default=[],
                    help="tasks that connect to the first member's port and hold the connection, like the "
                         "processes of JAX or PyTorch other than 0")
    ap.add_argument("--steal-port", action="append", default=[], help="THIEF=VICTIM: task THIEF listens on task VICTIM's port first")
    args = ap.parse_args()

    after = text_for(args.after_file, None)
    for _ in range(1200):  # bounded: 60 s
        if after is None or os.path.exists(after):
            break
        time.sleep(0.05)
    if selected(args.ignore_term):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.record:
        path = os.path.join(args.record, f"{TYPE}-{INDEX}.attempt{ATTEMPT}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid()}, f)
        os.replace(path + ".tmp", path)  # readers never see half a file
    held = []
    for spec in args.steal_port:
        thief, _, victim = spec.partition("=")
        if not selected([thief]):
            continue
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", cluster_address(victim)[1]))
        sock.listen()
        held.append(sock)
    if args.bind and not selected(args.no_bind):
        port = cluster_address(NAME)[1]
        if any(selected([spec.partition("=")[2]]) for spec in args.steal_port):
            wait_until_listened_on(port)  # the thief goes first
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            print(f"E0000 add_port.cc:83] Failed to add port to server: No address added out of total 1 "
                  f"resolved for '0.0.0.0:{port}'", file=sys.stderr, flush=True)
            print("tensorflow.python.framework.errors_impl.UnknownError: Could not start gRPC server",
                  file=sys.stderr, flush=True)
            sys.exit(1)
        sock.listen()
        held.append(sock)
    if selected(args.dial):
        cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
        first = "chief:0" if "chief" in cluster else "worker:0"
        for _ in range(400):  # bounded: the coordinator may not listen yet
            try:
                held.append(socket.create_connection(cluster_address(first), timeout=5))
                break
            except OSError:
                time.sleep(0.05)
    pid_dir = args.record or "."
    if selected(args.grandchild):
        spawn_sleeper(os.path.join(pid_dir, f"{TYPE}-{INDEX}.grandchild.pid"), new_session=False)
    if selected(args.setsid_grandchild):
        spawn_sleeper(os.path.join(pid_dir, f"{TYPE}-{INDEX}.setsid-grandchild.pid"), new_session=True)
    if selected(args.escaped_holder):
        spawn_escaped_holder(os.path.join(pid_dir, f"{TYPE}-{INDEX}.escaped.pid"))
    for i in range(args.lines):
        print(f"out {NAME} {i}", flush=True)
        print(f"err {NAME} {i}", file=sys.stderr, flush=True)
    if args.print_mb:
        line = (f"{NAME} " + "x" * 90 + "\n").encode()
        chunk = line * 1000
        for _ in range(int(args.print_mb * 1024 * 1024 / len(chunk)) + 1):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
        print(f"{NAME} printed {args.print_mb} MB", file=sys.stderr, flush=True)
    if args.ready and not selected(args.no_ready):
        print("MGPU_TASK_READY", flush=True)
    sleep = value_for(args.sleep_on, None)
    forever = args.forever and sleep is None
    deadline = time.monotonic() + (args.sleep if sleep is None else sleep)
    busy, tick = selected(args.busy), selected(args.tick)
    next_tick = time.monotonic()
    if args.until_file and sleep is None:
        deadline = time.monotonic() + 60
    while forever or time.monotonic() < deadline:
        if args.until_file and os.path.exists(args.until_file):
            break
        if tick and time.monotonic() >= next_tick:
            print(f"{NAME} tick", flush=True)
            next_tick = time.monotonic() + 0.2
        if not busy:
            time.sleep(0.05)
    code = int(value_for(args.fail, args.exit))
    print(f"{NAME} attempt {ATTEMPT} exiting with {code}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
