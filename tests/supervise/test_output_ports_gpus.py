"""The console writer, port picking and bind-failure recognition, GPU detection and assignment."""

import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import threading

import pytest

from launcher.host import gpus, ports_in_use
from launcher.plan import devices as plan_devices
from launcher.host import ports
from launcher.supervise import diagnosis
from launcher.errors import UsageError
from launcher.supervise.output import Console
from launching import MGPU, REPO, mgpu_env, wait_for
from needs import missing

pytestmark = pytest.mark.timeout(60)


def test_console_that_nobody_reads_never_blocks_the_writers():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    try:
        console = Console(stream, max_pending_chars=10_000)
        done = threading.Event()

        def write_a_lot():
            for i in range(100_000):  # about 2 MB: far more than the pipe and the buffer hold
                console.write_line(f"line {i:08d} of many\n")
            done.set()

        threading.Thread(target=write_a_lot, daemon=True).start()
        assert done.wait(30)
        console.close(timeout=0.5)  # the writer thread is stuck in a write; close gives up on it
        data = b""
        os.set_blocking(read_end, False)
        try:
            while chunk := os.read(read_end, 1 << 16):
                data += chunk
        except BlockingIOError:
            pass
        assert data.startswith(b"line 00000000 of many\n")
        assert len(data) < 1_000_000
    finally:
        os.close(read_end)


def test_console_too_slow_drops_whole_lines_and_counts_them():
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    console = Console(stream, max_pending_chars=5_000)
    lines = [f"worker line {i:06d} ".ljust(99, "x") + "\n" for i in range(5_000)]
    for line in lines:  # the pipe (64 KiB) fills, then the buffer: most lines are dropped
        console.write_line(line)
    console.write_line("[mgpu] always shown\n", always=True)
    received = []
    reader = threading.Thread(target=lambda: received.append(os.fdopen(read_end, "rb").read()))
    reader.start()
    console.close(timeout=10)
    stream.close()
    reader.join(10)
    text = received[0].decode()
    shown = [line for line in text.splitlines(keepends=True) if line.startswith("worker line")]
    notices = re.findall(r"^\[mgpu\] (\d+) lines not shown here \(console too slow\)", text, re.M)
    assert notices and "[mgpu] always shown\n" in text
    assert all(line in lines for line in shown)  # every shown line whole
    assert len(shown) + sum(map(int, notices)) == len(lines)
    assert shown == sorted(shown)


def test_pick_free_ports_are_distinct_and_bindable():
    picked = ports.pick_free_ports(20)
    assert len(set(picked)) == 20
    for port in picked:
        assert not ports_in_use.port_in_use(port)


def test_picked_ports_are_outside_the_ephemeral_range():
    """Where outgoing connections take their local ports: a port picked there may be some
    connection's by the time the task binds it."""
    low, high = ports.ephemeral_range()
    assert all(not low <= port <= high and port >= 1024 for port in ports.pick_free_ports(20))


@pytest.mark.parametrize("ephemeral, expected", [
    ((32768, 60999), 2000),  # Linux's default: tens of thousands outside it, drawn as asked
    ((1100, 65500), 76 + 35),  # few outside it: every one, in random order
    ((1024, 65535), 0),  # none
])
def test_candidate_ports_are_distinct_and_outside_the_ephemeral_range(ephemeral, expected):
    low, high = ephemeral
    candidates = list(ports._candidates(ephemeral, ports.MAX_TRIES))
    assert len(candidates) == len(set(candidates)) == expected
    assert all(1024 <= port <= 65535 and not low <= port <= high for port in candidates)
    assert candidates != sorted(candidates) or expected == 0


# Picks two ports as a launch of `--local 2` does (claimed for as long as it runs), prints them, and
# keeps them until its stdin closes.
PICKER = ("import os, sys\nfrom launcher.host.ports import pick_free_ports\nfrom launcher.supervise.run_lock import claim_port\n"
          "os.write(1, ('%d %d\\n' % tuple(pick_free_ports(2, claim=claim_port))).encode())\nsys.stdin.read()\n")


@pytest.mark.netns
def test_concurrent_launches_never_pick_the_same_port_even_with_a_tiny_ephemeral_range(tmp_path):
    """Ten launches at once, each picking two ports, in a network namespace whose ephemeral
    range has ten ports (the range is the namespace's own): twenty distinct ports, none in it."""
    if not (shutil.which("unshare") and shutil.which("ip")):
        missing("needs unshare and ip (util-linux, iproute2)")
    script = ("ip link set lo up && echo '40000 40009' > /proc/sys/net/ipv4/ip_local_port_range || exit 99\n"
              "exec 3<&0\n"
              f"for i in 1 2 3 4 5 6 7 8 9 10; do {sys.executable} -c \"$PICKER\" <&3 & done\n"
              "wait\n")
    env = {**os.environ, "PICKER": PICKER, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(["unshare", "--net", "sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, env=env) as proc:
        try:
            lines = [proc.stdout.readline() for _ in range(10)]  # all ten hold their ports now
        finally:
            proc.stdin.close()  # now they end
            assert proc.wait(30) == 0
    picked = [int(port) for line in lines for port in line.split()]
    assert len(picked) == 20 and len(set(picked)) == 20, picked
    assert not any(40000 <= port <= 40009 for port in picked)


# A task that listens on its own port, as TensorFlow's server does, says so with a file, and stays
# until the file GO exists.
LISTENER = r"""
import json, os, pathlib, socket, sys, time
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]
port = int(cluster[int(os.environ["MGPU_TASK_INDEX"])].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", port))
server.listen()
pathlib.Path(sys.argv[1], f"{port}-{os.getpid()}").touch()
deadline = time.monotonic() + 120
while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
"""


@pytest.mark.netns
def test_ten_concurrent_local_launches_with_a_tiny_ephemeral_range_all_listen(tmp_path):
    """Ten `mgpu launch --local 2` at once in a network namespace whose ephemeral range has ten
    ports: each of the twenty tasks listens on its own port, and every launch succeeds."""
    if not shutil.which("unshare"):
        missing("needs unshare (util-linux)")
    up, go = tmp_path / "up", tmp_path / "go"
    up.mkdir()
    launch = " ".join(shlex.quote(a) for a in [*MGPU, "launch", "--local", "2", "--no-check", "--log-dir", str(tmp_path),
                                                "--", sys.executable, "-c", LISTENER, str(up), str(go)])
    script = ("ip link set lo up && echo '40000 40009' > /proc/sys/net/ipv4/ip_local_port_range || exit 99\n"
              f"for i in 0 1 2 3 4 5 6 7 8 9; do {launch} > {shlex.quote(str(tmp_path))}/mgpu-$i.out 2>&1 & pids=\"$pids $!\"\n"
              "done\nfail=0\nfor pid in $pids; do wait $pid || fail=1; done\nexit $fail\n")
    proc = subprocess.Popen(["unshare", "--net", "sh", "-c", script], env=mgpu_env())
    try:
        def settled() -> bool:  # all up, or one launch has failed
            return len(list(up.iterdir())) == 20 or proc.poll() is not None or any(
                "stopping all tasks" in out.read_text(errors="replace") for out in tmp_path.glob("mgpu-*.out"))

        wait_for(settled, 180, what="twenty tasks listening")
        go.touch()
        assert proc.wait(120) == 0, "\n".join(f.read_text()[-600:] for f in sorted(tmp_path.glob("mgpu-*.out")))
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ports = {name.name.split("-")[0] for name in up.iterdir()}
    assert len(ports) == 20 and not any(40000 <= int(port) <= 40009 for port in ports)


def test_port_in_use_sees_a_listener():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        assert ports_in_use.port_in_use(holder.getsockname()[1])


def test_bind_failure_recognises_tensorflow_messages():
    tf_line = ("E0000 00:00:1795212871.275273 4465 add_port.cc:83] Failed to add port to server: "
               "No address added out of total 1 resolved for '0.0.0.0:37891'")
    assert diagnosis.bind_failure(tf_line) == 37891
    assert diagnosis.bind_failure("tensorflow...UnknownError: Could not start gRPC server") == 0
    assert diagnosis.bind_failure("OSError: [Errno 98] Address already in use") == 0
    # PyTorch's TCPStore on MASTER_PORT (torch 2.x)
    torch_line = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                  "address. port: 40251, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    assert diagnosis.bind_failure(torch_line) == 40251
    assert diagnosis.known_failures([torch_line]) == [diagnosis.PORT_TAKEN]
    assert diagnosis.bind_failure("epoch 1 loss 0.3") is None


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """Put an `nvidia-smi` script that runs `body` first on PATH."""
    def install(body):
        script = tmp_path / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + body + "\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return install


def test_detect_gpus_counts_the_listing(fake_nvidia_smi):
    fake_nvidia_smi('[ "$1" = "-L" ] || exit 9\n'
                    'echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1111)"\n'
                    'echo "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2222)"\n'
                    'echo "  MIG 1g.5gb Device 0: (UUID: MIG-3333)"')
    assert gpus.detect_gpus() == 2


def test_detect_gpus_failing_or_hanging_or_missing(fake_nvidia_smi, monkeypatch, tmp_path):
    fake_nvidia_smi('echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver"; exit 9')
    assert gpus.detect_gpus() == 0
    fake_nvidia_smi("exec sleep 30")
    assert gpus.detect_gpus(timeout=0.5) == 0
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpus.detect_gpus() == 0


def test_assign_visible_devices():
    assert plan_devices.assign_visible_devices(4, 2, None) == ["0,1", "2,3"]
    assert plan_devices.assign_visible_devices(5, 2, None) == ["0,1", "2,3"]
    assert plan_devices.assign_visible_devices(8, 3, 2) == ["0,1", "2,3", "4,5"]
    assert plan_devices.assign_visible_devices(0, 2, None) == ["", ""]
    assert plan_devices.assign_visible_devices(None, 2, None) == [None, None]
    assert plan_devices.assign_visible_devices(None, 2, 1) == ["0", "1"]
    assert plan_devices.assign_visible_devices(4, 2, 0) == ["", ""]
    assert plan_devices.assign_visible_devices(1, 2, None) == ["0", "0"]
    assert plan_devices.assign_visible_devices(3, 4, None) == ["0", "1", "2", "0"]
    with pytest.raises(UsageError, match="need 6 GPUs; the host has 4"):
        plan_devices.assign_visible_devices(4, 3, 2)
