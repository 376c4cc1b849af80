"""What the check judges of a host's answer about the task's own program and the host's own name
(preflight/program.py): pure, on answers made by hand."""

from launcher.preflight.host_report import HostReport
from launcher.preflight.probes import TaskNeeds
from launcher.preflight.program import interpreters_line, judge_own_names, judge_program

NEEDS = TaskNeeds("python3", "python3", True, (), script="train.py")


def judged(answer: dict, hosts: int = 2, env: dict | None = None, host: str = "h1") -> HostReport:
    report = HostReport(host, ("worker:0",), python="3.11.7")
    judge_program(report, NEEDS, answer)
    judge_own_names([report], env or {}, hosts)
    return report


def test_a_jax_programs_host_whose_own_name_is_loopback_fails_on_more_than_one_host():
    answer = {"executable": "/usr/bin/python3", "imports": ["jax"], "imports_missing": [],
              "own_name": "node1", "own_addresses": ["127.0.1.1"]}
    [problem] = judged(answer).problems
    assert problem.startswith("its own name node1 resolves to 127.0.1.1 there, where JAX's Gloo collectives")
    assert judged(answer, hosts=1).ok  # one host: loopback is where its peers are
    assert judged({**answer, "own_addresses": ["127.0.1.1", "10.0.0.5"]}).ok  # Gloo takes one its peers reach
    assert judged({**answer, "imports": ["torch"]}).ok  # torch's Gloo gets GLOO_SOCKET_IFNAME instead
    keras = {**answer, "imports": ["keras"]}
    assert judged(keras).ok  # Keras on TensorFlow
    assert not judged(keras, env={"KERAS_BACKEND": "jax"}).ok
    assert not judged({**keras, "keras_backend": "jax"}).ok
    unresolved = {**answer, "own_addresses": [], "own_name_error": "[Errno -3] Temporary failure in name resolution"}
    assert judged(unresolved).problems == [
        "its own name node1 does not resolve there ([Errno -3] Temporary failure in name resolution), and JAX's "
        "Gloo collectives listen on its address: map node1 to the address the other hosts reach in its /etc/hosts"]


def test_a_missing_module_names_the_interpreter_and_a_passing_check_names_it_per_host():
    report = judged({"executable": "/usr/bin/python3", "imports": ["torch", "os"], "imports_missing": ["torch"]})
    assert report.problems == ["no module torch for /usr/bin/python3, the python3 that runs the tasks (train.py "
                               "imports it): install it there, or name the interpreter that has it in the command"]
    other = judged({"executable": "/opt/venv/bin/python3", "imports": [], "imports_missing": []}, host="h2")
    assert interpreters_line([report, other], "python3") == (
        "the tasks run python3, /usr/bin/python3 (Python 3.11.7) on h1; /opt/venv/bin/python3 (Python 3.11.7) on h2")
    same = judged({"executable": "/opt/venv/bin/python3"}, host="h3")
    assert interpreters_line([other, same], "/opt/venv/bin/python3") == (
        "the tasks run /opt/venv/bin/python3 (Python 3.11.7) on h2, h3")
    assert interpreters_line([HostReport("h4", ())], "sh") is None
