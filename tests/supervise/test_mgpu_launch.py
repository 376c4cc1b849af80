"""The real `mgpu launch --local N -- python fake_worker.py ...` as a subprocess:
exit codes, signals to the launcher (including SIGKILL), and nothing left behind."""

import json
import os
import signal
import subprocess

import pytest

from launching import REPO, run_mgpu, start_mgpu, wait_for
from supervisor_helpers import FAKE_WORKER, assert_run_gone, pid_alive, read_pids, records
from launcher.host import proctree
from launcher.host.ports import pick_free_ports

pytestmark = pytest.mark.timeout(90)


class Launch:
    def __init__(self, run_id, tmp_path, worker_args, *launch_args, workers=2, new_session=False, grace=1.0):
        self.run_id = run_id
        self.run_dir = tmp_path / "runs" / run_id
        self.out_path = tmp_path / "mgpu.out"
        self.err_path = tmp_path / "mgpu.err"
        argv = ["launch", "--local", str(workers), "--run-id", run_id, "--log-dir", str(tmp_path / "runs"),
                "--grace-period", str(grace), *launch_args, "--", *FAKE_WORKER, *worker_args]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = start_mgpu(*argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   start_new_session=new_session)

    def wait(self, timeout=60):
        return self.proc.wait(timeout)

    @property
    def stdout(self):
        return self.out_path.read_text()

    @property
    def stderr(self):
        return self.err_path.read_text()

    @property
    def run(self):
        return json.loads((self.run_dir / "run.json").read_text())


@pytest.fixture
def launches():
    started = []
    yield lambda *a, **kw: started.append(Launch(*a, **kw)) or started[-1]
    for launch in started:
        if launch.proc.poll() is None:
            launch.proc.kill()
            launch.proc.wait()


def test_success_through_the_cli(run_id, record_dir, tmp_path, launches):
    launch = launches(run_id, tmp_path, ["--record", str(record_dir), "--lines", "2"], "--chief")
    assert launch.wait() == 0, launch.stderr
    recs = records(record_dir)
    assert sorted(recs) == ["chief-0.attempt0", "worker-0.attempt0", "worker-1.attempt0"]
    for key, rec in recs.items():
        task_type, index = key.split(".")[0].split("-")
        tf_config = json.loads(rec["env"]["TF_CONFIG"])
        assert tf_config["task"] == {"type": task_type, "index": int(index)}
        assert len(tf_config["cluster"]["worker"]) == 2 and len(tf_config["cluster"]["chief"]) == 1
        assert rec["env"]["MGPU_RUN_ID"] == run_id
    assert "[worker:1] out worker:1 1\n" in launch.stdout
    assert launch.run["status"] == "succeeded"
    assert_run_gone(run_id)


def test_the_documented_defaults_are_the_ones_a_run_gets(run_id, tmp_path):
    """docs/failures.md: `--grace-period` (10 s), `--start-timeout` (120 s); the stall timeout 1800 s."""
    done = run_mgpu("launch", "--local", "1", "--run-id", run_id, "--log-dir", str(tmp_path / "runs"), "--",
                    *FAKE_WORKER, timeout=120)
    assert done.returncode == 0, done.stderr
    options = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())["options"]
    assert (options["grace_period"], options["start_timeout"], options["stall_timeout"]) == (10.0, 120.0, 1800.0)
    docs = (REPO / "docs" / "failures.md").read_text()
    assert "`--grace-period` (10 s)" in docs and "`--start-timeout` (120 s)" in docs


def test_failure_through_the_cli(run_id, tmp_path, launches):
    launch = launches(run_id, tmp_path, ["--forever", "--fail", "worker:1=7", "--sleep-on", "worker:1=0.2"])
    assert launch.wait() == 1
    assert "worker:1 on 127.0.0.1 exited with code 7" in launch.stderr
    assert "Traceback" not in launch.stderr
    assert launch.run["attempts"][0]["tasks"]["worker:0"]["signal"] == "SIGTERM"
    assert_run_gone(run_id)


STUBBORN = ["--forever", "--ignore-term", "worker:0", "--grandchild", "all", "--setsid-grandchild", "all"]


def start_stubborn(run_id, record_dir, tmp_path, launches, **kw):
    launch = launches(run_id, tmp_path, ["--record", str(record_dir), *STUBBORN], **kw)
    # Both workers and their four grandchildren running.
    wait_for(lambda: len(read_pids(record_dir)) == 4 and len(records(record_dir)) == 2, 30,
             what=lambda: f"4 sleepers and 2 records:\n{launch.stderr}")
    assert len(proctree.tagged_processes(run_id)) == 6
    return launch


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_signal_to_the_launcher_stops_every_process(run_id, record_dir, tmp_path, launches, signum, to_group):
    launch = start_stubborn(run_id, record_dir, tmp_path, launches, new_session=True)
    if to_group:  # like Ctrl-C in a terminal: the launcher's whole foreground group
        os.killpg(launch.proc.pid, signum)
    else:
        launch.proc.send_signal(signum)
    assert launch.wait() == 128 + signum
    assert f"[mgpu] received {signal.Signals(signum).name}; stopping all tasks" in launch.stdout
    assert f"interrupted by signal {signum}" in launch.stderr and "Traceback" not in launch.stderr
    run = launch.run
    assert run["status"] == "interrupted"
    tasks = run["attempts"][0]["tasks"]
    # The tasks got TERM from the launcher (not the terminal's signal); worker:0 ignored it and was killed.
    assert tasks["worker:0"]["signal"] == "SIGKILL"
    assert tasks["worker:1"]["signal"] == "SIGTERM"
    assert not any(pid_alive(pid) for pid in read_pids(record_dir))
    assert_run_gone(run_id)


def test_sigkilled_launcher_leaves_nothing_behind(run_id, record_dir, tmp_path, launches):
    launch = start_stubborn(run_id, record_dir, tmp_path, launches)
    launch.proc.kill()
    assert launch.wait() == -signal.SIGKILL
    # The reaper: TERM, 1 s grace (worker:0 ignores TERM), KILL.
    wait_for(lambda: not proctree.tagged_processes(run_id), 20, what="no process of the run left")
    assert not any(pid_alive(pid) for pid in read_pids(record_dir))
    reaper_log = launch.run_dir / "reaper.log"
    wait_for(lambda: "processes of run" in reaper_log.read_text(), 10, what="the reaper's log line")
    assert "launcher gone" in reaper_log.read_text()
    run = launch.run
    assert run["status"] == "launcher-died" and run["attempts"][-1]["outcome"] == "launcher-died"
    assert run["message"].startswith("the launcher died before the run ended; its reaper stopped ")


def test_second_signal_skips_the_grace_period(run_id, record_dir, tmp_path, launches):
    launch = start_stubborn(run_id, record_dir, tmp_path, launches, new_session=True, grace=60)
    launch.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "[mgpu] received SIGINT" in launch.stdout, 20, what="[mgpu] received SIGINT")
    launch.proc.send_signal(signal.SIGINT)
    assert launch.wait() == 130
    assert "[mgpu] received SIGINT; stopping all tasks: waiting up to 60 s for them to exit (Ctrl-C again to kill now)" \
        in launch.stdout
    assert "[mgpu] second signal: killing all tasks now" in launch.stdout
    assert launch.run["attempts"][0]["tasks"]["worker:0"]["signal"] == "SIGKILL"
    assert_run_gone(run_id)


def test_a_run_id_in_use_elsewhere_is_refused_and_its_tasks_are_left_alone(run_id, record_dir, tmp_path, launches):
    first = launches(run_id, tmp_path, ["--record", str(record_dir), "--forever"])
    wait_for(lambda: len(records(record_dir)) == 2, 30, what=lambda: f"2 records:\n{first.stderr}")
    task_pids = sorted(rec["pid"] for rec in records(record_dir).values())
    (tmp_path / "second").mkdir()
    second = launches(run_id, tmp_path / "second", [], workers=1)  # same run id, another log dir
    assert second.wait() == 2
    assert f"run id {run_id} is in use by running processes" in second.stderr
    assert "Traceback" not in second.stderr
    assert not second.run_dir.exists()
    assert first.proc.poll() is None and all(pid_alive(pid) for pid in task_pids)
    assert sorted(p.pid for p in proctree.tagged_processes(run_id)) == task_pids
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait() == 128 + signal.SIGTERM
    assert_run_gone(run_id)


def test_a_log_dir_that_cannot_be_created_is_a_usage_error(tmp_path):
    result = run_mgpu("launch", "--local", "1", "--log-dir", "/proc/mgpu-no-such-dir", "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert "--log-dir /proc/mgpu-no-such-dir: No such file or directory" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "internal error" not in result.stderr


def test_an_existing_run_is_refused_before_connecting_to_any_host(tmp_path):
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "run.json").write_text("{}")
    [closed_port] = pick_free_ports(1)  # nothing listens there: connecting would fail
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host unreachable-host\n  HostName 127.0.0.1\n  Port {closed_port}\n")
    result = run_mgpu("launch", "--workers", "unreachable-host:2222", "--ssh-config", str(ssh_config),
                      "--run-id", "taken", "--log-dir", str(tmp_path / "runs"), "--", "true", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"run taken already exists in {tmp_path / 'runs' / 'taken'}" in result.stderr
