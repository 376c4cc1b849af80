"""GPU split: every task gets its own CUDA_VISIBLE_DEVICES, from nvidia-smi's count, without TensorFlow."""


def devices(result):
    assert result.exit_code == 0, result.stderr
    return [task["env"].get("CUDA_VISIBLE_DEVICES") for task in result.json()["tasks"]]


def test_local_tasks_split_the_gpus(mgpu, gpus_on_path):
    env = gpus_on_path(4)
    assert devices(mgpu("launch", "--local", "2", "--dry-run", "--json", env=env)) == ["0,1", "2,3"]
    assert devices(mgpu("launch", "--local", "2", "--evaluator", "--dry-run", "--json", env=env)) == ["0", "1", "2"]
    assert devices(mgpu("launch", "--local", "3", "--gpus-per-task", "1", "--dry-run", "--json", env=env)) == [
        "0", "1", "2"]


def test_no_gpus_sets_an_empty_value(mgpu, gpus_on_path):
    env = gpus_on_path(0)
    assert devices(mgpu("launch", "--local", "2", "--dry-run", "--json", env=env)) == ["", ""]


def test_too_few_gpus_is_refused(mgpu, gpus_on_path):
    result = mgpu("launch", "--local", "2", "--gpus-per-task", "3", "--dry-run", env=gpus_on_path(4))
    assert result.exit_code == 2
    assert "2 tasks x 3 GPUs each need 6 GPUs; the host has 4" in result.stderr


def test_remote_hosts_number_their_own_tasks(mgpu, gpus_on_path):
    env = gpus_on_path(0)
    result = mgpu("launch", "--workers", "h1:2222,h1:2223,h2:2222", "--gpus-per-task", "2", "--dry-run", "--json", env=env)
    assert devices(result) == ["0,1", "2,3", "0,1"]
    # Without --gpus-per-task a remote host's GPUs are not known at planning time: leave them alone.
    assert devices(mgpu("launch", "--workers", "h1:2222,h2:2222", "--dry-run", "--json", env=env)) == [None, None]
