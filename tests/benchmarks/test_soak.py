"""`benchmarks/soak.py`: its schedule of faults, how it judges what mgpu charged, and what the page
shows. The soak itself runs for minutes over network namespaces; it is a benchmark, run by hand."""

import sys

from launching import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "backends" / "ssh"))
import render_docs  # noqa: E402
import soak  # noqa: E402


def test_a_seed_draws_the_same_schedule_and_the_short_one_has_every_fault_once():
    short = [f.kind for f in soak.schedule(55, len(soak.FAULTS), 600, 40)]
    assert short == [f.kind for f in soak.schedule(55, len(soak.FAULTS), 600, 40)]
    assert sorted(short) == sorted(soak.FAULTS)
    assert short != [f.kind for f in soak.schedule(56, len(soak.FAULTS), 600, 40)] or \
        short != [f.kind for f in soak.schedule(57, len(soak.FAULTS), 600, 40)]
    rounds = 2 * len(soak.FAULTS) + 1
    long = [f.kind for f in soak.schedule(55, rounds, 20000, 40)]
    assert len(long) == rounds and all(long.count(kind) >= 2 for kind in soak.FAULTS)
    assert sorted(f.kind for f in soak.schedule(55, 2, 600, 40, ("kill9", "cpu-starved"))) == ["cpu-starved", "kill9"]


def judged(kind: str, cause: str, task: str, host: str) -> bool:
    fault = soak.Fault(kind, 10, task="worker:1", host="h2", injected_at=100.0, attempt=0)
    attempt = {"attempt": 0, "ended_at": "1970-01-01T00:02:10+00:00", "cause": cause, "task": task, "host": host}
    self = type("Judge", (), {})()
    soak.Soak.judge(self, fault, {"attempts": [attempt]})
    assert fault.detected_s == 30.0
    return fault.right


def test_each_fault_is_right_only_when_charged_to_its_cause_and_its_task_or_host():
    assert judged("kill9", "killed", "worker:1", "h2")
    assert not judged("kill9", "killed", "worker:0", "h1")  # the peer that saw the reset is not at fault
    assert judged("sigstop", "stalled", "worker:1", "h2")
    assert not judged("sigstop", "stalled", None, None)  # a stall that names nobody
    assert judged("link-cut", "network", "worker:1", "h2") and judged("host-dead", "host-lost", "worker:1", "h2")
    assert not judged("coordinator-lost", "stalled", "worker:1", "h2")


def went_on(kind: str, attempt: dict, console: str = "") -> soak.Fault:
    fault = soak.Fault(kind, 10, task="worker:1", host="h2", injected_at=100.0, attempt=0)
    self = type("Judge", (), {})()
    self.console_log = type("Log", (), {"read_text": lambda _, errors=None: console})()
    soak.Soak.judge(self, fault, {"attempts": [{"attempt": 0, **attempt}]})
    return fault


def test_a_lasting_fault_is_right_only_when_the_run_went_on():
    assert went_on("slow-link", {}).right
    assert went_on("log-disk-full", {}).charged == {"cause": "went on", "task": None, "host": None}
    ended = went_on("slow-link", {"ended_at": "1970-01-01T00:02:10+00:00", "cause": "stalled", "task": None})
    assert not ended.right and ended.charged["cause"] == "stalled"
    assert went_on("launcher-sighup", {}, "[mgpu] the terminal hung up (SIGHUP); the run goes on").right
    assert not went_on("launcher-sighup", {}, "").right  # the console was not moved
    starved = went_on("cpu-starved", {"slowest": {"task": "worker:1", "host": "h2", "at": "1970-01-01T00:02:00+00:00"}})
    assert starved.right and starved.charged["task"] == "worker:1" and starved.detected_s == 20.0


def test_the_page_shows_each_fault_and_the_run():
    result = {"date": "2026-11-28", "machine": "x86_64, 2 cores", "seed": 55, "workers": 3, "spares": 3, "steps": 600,
              "stall_timeout_s": 20.0, "cut_s": 40.0, "exit_code": 0, "status": "succeeded", "wall_s": 400.0,
              "restarts": 5, "time_lost_s": 250.0, "goodput": 0.4, "equal_weights": True, "processes_left": 0,
              "charged_right": 3, "faults": [
                  {"kind": "sigstop", "task": "worker:2", "host": "h3", "right": True, "detected_s": 21.5,
                   "first_step_s": 40.2, "charged": {"cause": "stalled", "task": "worker:2", "host": "h3"}},
                  {"kind": "launcher-sighup", "task": None, "host": None, "right": True, "detected_s": None,
                   "first_step_s": None, "charged": {"cause": "went on", "task": None, "host": None}},
                  {"kind": "cpu-starved", "task": "worker:1", "host": "h2", "right": True, "detected_s": 12.0,
                   "first_step_s": None, "charged": {"cause": "went on", "task": "worker:1", "host": "h2"}}]}
    page = "\n".join(render_docs._soak(result))
    assert "| launcher-sighup | the launcher | went on | yes | - | - |" in page
    assert "| cpu-starved | worker:1 (h2) | went on (slowest: worker:1 on h2) | yes | 12 s | - |" in page
    assert "| sigstop | worker:2 (h3) | stalled (worker:2 on h3) | yes | 21.5 s | 40.2 s |" in page
    assert "Charged right: 3 of 3;" in page and "goodput 0.4;" in page and "equal weights on every rank: yes" in page
    result["faults"].append({"kind": "launcher-sigterm", "task": None, "host": None, "right": True, "detected_s": 3.5,
                             "first_step_s": 9.0, "charged": {"cause": "interrupted", "task": None, "host": None}})
    result["first_run"] = {"run_id": "soak-55-1", "exit_code": 143, "status": "interrupted", "goodput": 0.5,
                           "processes_left": 0}
    page = "\n".join(render_docs._soak(result))
    assert "| launcher-sigterm | the launcher | interrupted | yes | 3.5 s | 9 s |" in page
    assert "stopped the first launch (interrupted, exit code 143, goodput 0.5 until then, processes left: 0)" in page


def test_on_private_disks_the_launch_syncs_the_program_and_runs_its_copy(tmp_path):
    import soak_private
    private = object.__new__(soak_private.PrivateSoak)
    private.args = type("Args", (), {"rounds": 3, "stall_timeout": 20.0, "steps": 400})()
    private.dir, private.folder, private.run_id = tmp_path, tmp_path / "shared", "soak-55"
    private.private, private.source = tmp_path / "private", tmp_path / "source"
    argv = private.launch_argv(["h1", "h2"], ["h3"])
    assert argv[argv.index("--workdir") + 1] == f"{tmp_path}/private/work"
    assert argv[argv.index("--sync") + 1] == f"{tmp_path}/source" and argv.index("--sync") < argv.index("--")
    assert argv[argv.index("--") + 1:] == [soak.PYTHON, "soak_program.py", f"{tmp_path}/shared", "400", "."]


def test_the_trainers_progress_is_the_last_sample_of_the_run(tmp_path):
    import soak_trainer
    trainer = object.__new__(soak_trainer.TrainerSoak)
    trainer.run_json = tmp_path / "run.json"
    samples = tmp_path / "samples.jsonl"
    assert trainer.progress() is None  # no samples yet
    samples.write_text('{"at": 10.0, "attempt": 0, "steps": {"worker:0": 5, "worker:1": null}}\n'
                       '{"at": 12.5, "attempt": 1, "steps": {"worker:0": 40, "worker:1": 38}}\n')
    assert trainer.progress() == (1, 40, 12.5)
    samples.write_text('{"at": 14.0, "attempt": 2, "steps": {"worker:0": null, "worker:1": null}}\n')
    assert trainer.progress() is None  # a new attempt before its first step
    samples.write_text('{"at": 14.0, "attempt": 2, "steps": ["not", "a", "dict"]}\n')
    assert trainer.progress() is None
