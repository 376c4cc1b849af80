"""--exit-codes and the spec's exit_codes: on the command line: the dry run shows the table in force,
bad input is one line and exit 2."""

from launching import run_mgpu


def test_the_dry_run_shows_the_exit_codes_in_force(tmp_path):
    done = run_mgpu("launch", "--workers", "h1:2222", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "exit codes: 42=restart-free (default)" in done.stdout.splitlines()
    spec = tmp_path / "cluster.yaml"
    spec.write_text("cluster: {worker: [h1:2222]}\nexit_codes: {3: fail, 75: restart-free}\n")
    done = run_mgpu("launch", "--spec", str(spec), "--exit-codes", "3=restart,42=fail", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert ("exit codes: 3=restart (--exit-codes), 42=fail (--exit-codes), 75=restart-free (spec exit_codes)"
            in done.stdout.splitlines())


def test_a_bad_table_is_one_line_and_nothing_starts(tmp_path):
    done = run_mgpu("launch", "--workers", "h1:2222", "--exit-codes", "3=retry", "--dry-run")
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["mgpu: error: Invalid value for '--exit-codes': exit code 3: 'retry' is not "
                                        "an action (restart, restart-free, fail, leave-out-host)"]
    spec = tmp_path / "cluster.yaml"
    spec.write_text("cluster: {worker: [h1:2222]}\nexit_codes: {0: fail}\n")
    done = run_mgpu("launch", "--spec", str(spec), "--dry-run")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"mgpu: error: {spec}: exit_codes: exit code 0 is out of range: give 1 to "
                                        f"127 (0 is success; 128 and above are signals)"]
