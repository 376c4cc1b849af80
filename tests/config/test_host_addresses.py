"""TF_CONFIG lists the address each host is reached at: an ssh-config alias becomes its HostName,
a spec's `hosts.H.address` wins over that, and --keep-host-names writes names as given."""

import json


def write_config(tmp_path, text: str):
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return str(path)


ALIASES = "Host h1\n  HostName 10.0.0.5\nHost h2\n  HostName 10.0.0.6\n  Port 2022\n"


def dry_run(mgpu, *args):
    result = mgpu("launch", *args, "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()["tasks"]


def test_aliases_become_their_hostname_in_tf_config(mgpu, tmp_path):
    config = write_config(tmp_path, ALIASES)
    tasks = dry_run(mgpu, "--workers", "h1:2222,h2:2222,h3:2222", "--ssh-config", config)
    assert [(t["host"], t.get("address")) for t in tasks] == [("h1", "10.0.0.5"), ("h2", "10.0.0.6"), ("h3", None)]
    for task in tasks:
        assert task["tf_config"]["cluster"] == {"worker": ["10.0.0.5:2222", "10.0.0.6:2222", "h3:2222"]}


def test_keep_host_names_writes_them_as_given(mgpu, tmp_path):
    config = write_config(tmp_path, ALIASES)
    tasks = dry_run(mgpu, "--workers", "h1:2222,h2:2222", "--ssh-config", config, "--keep-host-names")
    assert all("address" not in t for t in tasks)
    assert tasks[0]["tf_config"]["cluster"] == {"worker": ["h1:2222", "h2:2222"]}


def test_the_spec_address_wins_over_the_ssh_config(mgpu, tmp_path):
    config = write_config(tmp_path, ALIASES)
    spec = tmp_path / "spec.yaml"
    spec.write_text("cluster:\n  worker: [h1:2222, h2:2222]\nhosts:\n  h1: {address: 192.168.7.1, user: bob}\n")
    tasks = dry_run(mgpu, "--spec", str(spec), "--ssh-config", config)
    assert tasks[1]["tf_config"]["cluster"] == {"worker": ["192.168.7.1:2222", "10.0.0.6:2222"]}
    assert tasks[0]["address"] == "192.168.7.1"


def test_dry_run_text_shows_the_name_and_the_address(mgpu, tmp_path):
    config = write_config(tmp_path, ALIASES)
    result = mgpu("launch", "--workers", "h1:2222,h2:2222", "--ssh-config", config, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "worker:0  h1:2222 at 10.0.0.5:2222  (ssh h1)" in result.stdout
    assert '"worker": ["10.0.0.5:2222", "10.0.0.6:2222"]' in result.stdout


def test_an_alias_for_loopback_mixed_with_a_remote_host_is_refused(mgpu, tmp_path):
    config = write_config(tmp_path, "Host h1\n  HostName 127.0.0.1\nHost h2\n  HostName 10.0.0.6\n")
    result = mgpu("launch", "--workers", "h1:2222,h2:2222", "--ssh-config", config, "--dry-run")
    assert result.exit_code == 2
    assert "loopback address 127.0.0.1 is mixed with remote host 10.0.0.6" in result.stderr


def test_a_bad_spec_address_is_refused(mgpu, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("cluster:\n  worker: [h1:2222]\nhosts:\n  h1: {address: 'a b'}\n")
    result = mgpu("launch", "--spec", str(spec), "--dry-run")
    assert result.exit_code == 2
    assert "hosts.h1.address" in result.stderr


def test_without_an_ssh_config_names_stay(mgpu, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config: nothing resolves differently, nothing is added
    tasks = dry_run(mgpu, "--workers", "h1:2222,h2:2222")
    assert all("address" not in t for t in tasks)
    assert json.dumps(tasks[0]["tf_config"]["cluster"]) == '{"worker": ["h1:2222", "h2:2222"]}'


def test_tf_config_gives_the_addresses_launch_gives(mgpu, tmp_path):
    config = write_config(tmp_path, ALIASES)
    launched = dry_run(mgpu, "--workers", "h1:2222,h2:2222", "--ssh-config", config)
    printed = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1", "--ssh-config", config)
    assert printed.exit_code == 0, printed.stderr
    assert json.loads(printed.stdout) == launched[1]["tf_config"]
    assert launched[1]["tf_config"]["cluster"] == {"worker": ["10.0.0.5:2222", "10.0.0.6:2222"]}
    kept = mgpu("tf-config", "--workers", "h1:2222,h2:2222", "--task-index", "1", "--ssh-config", config,
                "--keep-host-names")
    assert json.loads(kept.stdout)["cluster"] == {"worker": ["h1:2222", "h2:2222"]}
