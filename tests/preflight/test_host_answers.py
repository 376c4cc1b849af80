"""What a host answers its check with is read as data from elsewhere: a user's start-up file, a
`python3` first on the host's PATH, or the host itself may answer anything. Here a stand-in
`python3` answers `mgpu check` for a host on this machine with a crafted JSON line (or a flood of
bytes): each bad answer is one line naming the host and exit 1, never an internal error, and every
text the host sent reaches the terminal with its control characters escaped.
"""

import json
import pathlib
import sys

import pytest

import launching

pytestmark = pytest.mark.timeout(90)

# A stand-in for the host's Python: it answers the probe with ANSWER, where TARGET is the address the
# probe was told to dial (the reachability test's argument after `-c SOURCE reach PORTS`).
STAND_IN = """#!{python}
import pathlib, sys
target = sys.argv[5] if sys.argv[3:4] == ["reach"] else "-"
sys.stdout.write(pathlib.Path({answer!r}).read_text().replace("TARGET", target))
"""


def stand_in(tmp_path: pathlib.Path, answer: str) -> pathlib.Path:
    (tmp_path / "answer").write_text(answer)
    python = tmp_path / "python3"
    python.write_text(STAND_IN.format(python=sys.executable, answer=str(tmp_path / "answer")))
    python.chmod(0o755)
    return python


def good_answer(**changes) -> dict:
    """What the probe (host/probe/) answers for one task on a host with every check passed."""
    answer = {"python": "3.11.7", "busy_ports": [], "missing_modules": [], "tensorflow_error": "not installed",
              "gpus": 0,
              "reach": {"listen_errors": {}, "reach": {"TARGET": "ok"}, "dialed": {"TARGET": "127.0.0.1"},
                        "addresses": [["127.0.0.1", "lo"]]},
              "speed": {"cpu_gflops": 5.0, "gpu_gflops": None, "send_mbps": None, "seconds": 0.3}}
    answer.update(changes)
    return answer


def check(tmp_path: pathlib.Path, answer: str):
    python = stand_in(tmp_path, answer)
    port = launching.free_port()
    return launching.run_mgpu("check", "--workers", f"localhost:{port}", "--", str(python), "train.py",
                              timeout=60, text=False)


def one_error_line(result) -> str:
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 1, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("mgpu: ")]
    assert len(errors) == 1, stderr
    return errors[0]


CANNOT_READ = "mgpu: error: host localhost answered the check with something mgpu cannot read: "
DEEP = "[" * 100_000 + "]" * 100_000

BAD_ANSWERS = [
    ("list-for-object", json.dumps(good_answer(reach=[])), "reach is a list, not an object"),
    ("list-for-speed", json.dumps(good_answer(speed=[1, 2])), "speed is a list, not an object"),
    ("wrong-types", json.dumps({"python": 5, "busy_ports": "x", "missing_modules": 7, "gpus": {}}),
     "python is a number, not a text"),
    ("ports-not-ports", json.dumps(good_answer(busy_ports=["x"])), "busy_ports is a list, not a list of ports"),
    ("modules-not-texts", json.dumps(good_answer(missing_modules=7)), "missing_modules is a number, not a list"),
    ("reach-outcome-not-text", json.dumps(good_answer(reach={**good_answer()["reach"], "reach": {"TARGET": 1}})),
     "reach.reach is an object, not an object of texts"),
    ("addresses-not-pairs", json.dumps(good_answer(reach={**good_answer()["reach"], "addresses": [[1, 2, 3]]})),
     "reach.addresses is a list, not a list of [address, interface] pairs"),
    ("huge-count", json.dumps(good_answer(gpus=10 ** 30)), "gpus is a number, not a count from 0 to 65536"),
    ("huge-port", json.dumps(good_answer(busy_ports=[2 ** 70])), "busy_ports is a list, not a list of ports"),
    ("too-many-digits", json.dumps(good_answer(gpus=0)).replace('"gpus": 0', '"gpus": 1' + "0" * 5000),
     "a number of too many digits"),
    ("infinite", json.dumps(good_answer(gpus=0)).replace('"gpus": 0', '"gpus": 1e999'), "1e999 is out of range"),
    ("nan", json.dumps(good_answer(gpus=0)).replace('"gpus": 0', '"gpus": NaN'), "NaN is not a number mgpu reads"),
    ("nan-figure", json.dumps(good_answer()).replace('"cpu_gflops": 5.0', '"cpu_gflops": NaN'),
     "NaN is not a number mgpu reads"),
    ("deeply-nested", json.dumps(good_answer(gpus=0)).replace('"gpus": 0', '"gpus": ' + DEEP), "JSON nested too deeply"),
    ("huge-line", json.dumps(good_answer(python="3" * 2_000_000)), "a line of 2000"),
    ("long-version", json.dumps(good_answer(python="3" * 1000)), "python is a text, not a text of at most 100"),
]


@pytest.mark.parametrize("answer,reason", [case[1:] for case in BAD_ANSWERS], ids=[case[0] for case in BAD_ANSWERS])
def test_a_bad_answer_is_one_line_naming_the_host(tmp_path, answer, reason):
    line = one_error_line(check(tmp_path, answer + "\n"))
    assert line.startswith(CANNOT_READ) and reason in line, line


def test_a_flood_of_output_is_cut_off_and_the_command_stopped(tmp_path):
    python = tmp_path / "python3"
    marker = tmp_path / "flooder.pid"
    # The flood comes from a child of the stand-in, which keeps the pipe open if left alive.
    python.write_text(f"#!/bin/sh\nsh -c 'echo $$ > {marker}; exec cat /dev/zero'\n")
    python.chmod(0o755)
    port = launching.free_port()
    result = launching.run_mgpu("check", "--workers", f"localhost:{port}", "--", str(python), "train.py",
                                timeout=60, text=False)
    line = one_error_line(result)
    assert line == CANNOT_READ + "more than 4 MiB on stdout", line
    pid = int(marker.read_text())
    launching.wait_for(lambda: not pathlib.Path(f"/proc/{pid}").exists()
                       or "Z" in pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2], 10, "the flooder's end")


CONTROLS = (b"\x1b", b"\r", b"\x07", b"\x9b".decode("latin-1").encode(), "\u202e".encode())


def assert_escaped(output: bytes) -> None:
    for control in CONTROLS:
        assert control not in output, output[-2000:]
    assert b"\\x1b" in output, output[-2000:]


def test_a_hosts_texts_are_escaped_in_the_table_and_the_lines_of_a_passed_check(tmp_path):
    answer = good_answer(python="3.11\x1b[2J\r", tensorflow_error="not installed",
                         speed={"cpu_gflops": None, "gpu_gflops": None, "send_mbps": None,
                                "cpu_error": "no numpy\x1b]0;owned\x07\u202e"},
                         reach={**good_answer()["reach"], "addresses": [["127.0.0.1", "lo\x1b[31m"]]})
    result = check(tmp_path, json.dumps(answer) + "\n")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output.decode("utf-8", "replace")
    assert_escaped(output)
    text = output.decode()
    assert "3.11\\x1b[2J\\x0d" in text and "no numpy\\x1b]0;owned\\x07\\u202e" in text
    assert "NCCL and Gloo use lo\\x1b[31m on localhost" in text


def test_a_hosts_texts_are_escaped_in_the_failures(tmp_path):
    answer = good_answer(missing_modules=["train\x1b[2J (No module\r named x)"], tensorflow="2\x1b[31m",
                         reach={**good_answer()["reach"], "reach": {"TARGET": "refused\x1b[1A"}})
    result = check(tmp_path, json.dumps(answer) + "\n")
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert_escaped(output)
    assert "cannot import train\\x1b[2J (No module\\x0d named x)" in output.decode()


def test_the_error_text_of_a_probe_that_did_not_run_is_escaped(tmp_path):
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nprintf 'boom\\033[2J\\r\\n' >&2\nexit 3\n")
    python.chmod(0o755)
    port = launching.free_port()
    result = launching.run_mgpu("check", "--workers", f"localhost:{port}", "--", str(python), "train.py",
                                timeout=60, text=False)
    line = one_error_line(result)
    assert line == "mgpu: error: check failed on localhost: the check did not run: boom\\x1b[2J", line
    assert_escaped(result.stdout + result.stderr)
