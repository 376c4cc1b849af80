"""--min-hosts on the command line and `min_hosts:` in spec files: the dry run shows it, the
supervision gets it, and a number the run cannot use is bad input (one line, exit 2)."""

import pytest

from launcher.cli.options import launch_options_from, with_min_hosts
from launcher.config.spec_file import load_spec_text
from launcher.errors import SpecError, UsageError
from launcher.fleet.relaunch import relaunch_command

TWO = ("--workers", "h1:2222,h2:2222,h3:2222")


def test_the_dry_run_shows_min_hosts(mgpu):
    done = mgpu("launch", *TWO, "--min-hosts", "2", "--max-restarts", "3", "--dry-run")
    assert done.exit_code == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "min hosts: 2 (with no spare left, the run goes on without a host left out while 2 or more remain)")
    done = mgpu("launch", *TWO, "--max-restarts", "3", "--dry-run")
    assert "min hosts" not in done.stdout


def test_spec_files_give_min_hosts_and_the_command_line_wins(tmp_path, mgpu):
    text = "cluster:\n  worker: [h1:2222, h2:2222, h3:2222]\nmin_hosts: 2\n"
    assert load_spec_text(text, "c.yaml").min_hosts == 2
    with pytest.raises(SpecError, match="min_hosts must be a whole number >= 1"):
        load_spec_text("cluster:\n  worker: [h1:2222]\nmin_hosts: 0\n", "c.yaml")
    (tmp_path / "c.yaml").write_text(text)
    done = mgpu("launch", "--spec", str(tmp_path / "c.yaml"), "--max-restarts", "1", "--dry-run", "--", "python3", "t.py")
    assert done.exit_code == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("min hosts: 2 ")
    spec = load_spec_text(text, "c.yaml")
    assert with_min_hosts(spec, {"min_hosts": 3, "max_restarts": 1}).min_hosts == 3
    options = launch_options_from({**OPTS, "min_hosts": 3}, "r", with_min_hosts(spec, {"min_hosts": 3, "max_restarts": 1}))
    assert options.supervise.min_hosts == 3 and options.supervise.rules().min_hosts == 3
    assert options.supervise.recorded()["min_hosts"] == 3


@pytest.mark.parametrize("args, message", [
    (("--min-hosts", "4", "--max-restarts", "1"), "mgpu: error: --min-hosts 4: the run has 3 hosts"),
    (("--min-hosts", "2"), "mgpu: error: --min-hosts 2 goes on with fewer hosts by restarting the cluster: "
                           "give --max-restarts too"),
    (("--min-hosts", "0", "--max-restarts", "1"), None),
])
def test_a_min_hosts_the_run_cannot_use_is_bad_input(mgpu, args, message):
    done = mgpu("launch", *TWO, *args, "--dry-run")
    assert done.exit_code == 2, done.stdout
    if message:
        assert done.stderr.strip() == message
    else:
        assert "--min-hosts" in done.stderr and len(done.stderr.strip().splitlines()) <= 3


def test_without_min_hosts_the_spec_is_unchanged():
    spec = load_spec_text("cluster:\n  worker: [h1:2222]\n", "c.yaml")
    assert with_min_hosts(spec, {"min_hosts": None, "max_restarts": 0}) is spec
    with pytest.raises(UsageError):
        with_min_hosts(spec, {"min_hosts": 2, "max_restarts": 1})


OPTS = {"log_dir": "mgpu-runs", "grace_period": 5.0, "start_timeout": 120.0, "stall_timeout": None, "slow_window": 60.0,
        "max_restarts": 1, "timestamps": False, "show": None, "show_tf_logs": False, "show_secrets": False,
        "no_check": False, "allow_public": False, "leave_out_slow": False, "detach": False}


def test_the_relaunch_command_leaves_min_hosts_out():
    argv = ["launch", "--workers", "h1:2222,h2:2222,h3:2222", "--min-hosts", "2", "--max-restarts", "2", "--", "t.py"]
    assert relaunch_command(argv, ["h1", "h2"]) == "mgpu launch --workers h3:2222 --max-restarts 2 -- t.py"
    assert relaunch_command(["launch", "--min-hosts=2", "--workers", "h1,h2"], "h2") == "mgpu launch --workers h1"
