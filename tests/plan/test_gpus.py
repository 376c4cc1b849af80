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


SHARED_GPU_ENV = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def memory_env(task):
    return {name: task["env"][name] for name in SHARED_GPU_ENV if name in task["env"]}


def test_tasks_sharing_a_gpu_grow_their_memory_instead_of_taking_it(mgpu, gpus_on_path):
    """3 tasks on 2 GPUs: GPU 0 has tasks 0 and 2, which must not preallocate; task 1 has GPU 1 alone."""
    two_gpus = gpus_on_path(2)
    result = mgpu("launch", "--local", "3", "--dry-run", "--json", env=two_gpus)
    assert result.exit_code == 0, result.stderr
    tasks = result.json()["tasks"]
    assert [task["env"]["CUDA_VISIBLE_DEVICES"] for task in tasks] == ["0", "1", "0"]
    assert [memory_env(task) for task in tasks] == [SHARED_GPU_ENV, {}, SHARED_GPU_ENV]
    text = mgpu("launch", "--local", "3", "--dry-run", env=two_gpus).stdout
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in text and "XLA_PYTHON_CLIENT_PREALLOCATE=false" in text


def test_tasks_with_their_own_gpus_or_none_keep_the_defaults(mgpu, gpus_on_path):
    for count, local in ((4, "2"), (0, "3")):
        result = mgpu("launch", "--local", local, "--dry-run", "--json", env=gpus_on_path(count))
        assert [memory_env(task) for task in result.json()["tasks"]] == [{}] * int(local)
    result = mgpu("launch", "--workers", "h1,h2", "--dry-run", "--json", env=gpus_on_path(1))  # uncounted GPUs
    assert [memory_env(task) for task in result.json()["tasks"]] == [{}, {}]


def test_the_users_memory_settings_win(mgpu, gpus_on_path):
    result = mgpu("launch", "--local", "2", "--env", "XLA_PYTHON_CLIENT_PREALLOCATE=true", "--show-secrets",
                  "--dry-run", "--json", env=gpus_on_path(1))
    assert [memory_env(task) for task in result.json()["tasks"]] == [
        {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}] * 2


# -- One rule for every framework (plan/devices.py) -------------------------------------------

def gpu_plan(mgpu, env, *args):
    result = mgpu("launch", "--dry-run", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    return [(task["env"].get("CUDA_VISIBLE_DEVICES"), task["env"].get("LOCAL_RANK"), task["gpus"])
            for task in result.json()["tasks"]]


def test_a_program_of_its_own_sees_every_gpu_and_local_rank_picks_one(mgpu, gpus_on_path):
    """torchrun's convention: CUDA_VISIBLE_DEVICES left alone, so set_device(LOCAL_RANK) finds GPU LOCAL_RANK;
    the tasks share the host's GPUs, so TF and JAX grow their memory."""
    two_gpus = gpus_on_path(2)
    plan = gpu_plan(mgpu, two_gpus, "--local", "2", "--", "python3", "train.py")
    assert [(visible, local) for visible, local, _ in plan] == [(None, "0"), (None, "1")]
    assert all(rule.startswith("every GPU: a program of its own") and "--gpus-per-task K" in rule
               for _, _, rule in plan)
    result = mgpu("launch", "--local", "2", "--dry-run", "--json", "--", "python3", "train.py", env=two_gpus)
    assert [memory_env(task) for task in result.json()["tasks"]] == [SHARED_GPU_ENV] * 2
    # Alone on its host, a task shares nothing.
    result = mgpu("launch", "--local", "1", "--dry-run", "--json", "--", "python3", "train.py", env=two_gpus)
    assert [memory_env(task) for task in result.json()["tasks"]] == [{}]


def test_tensorflow_programs_and_the_users_count_get_the_split(mgpu, gpus_on_path):
    two_gpus = gpus_on_path(2)
    plan = gpu_plan(mgpu, two_gpus, "--local", "2")
    assert [(visible, rule) for visible, _, rule in plan] == [
        ("0", "split: the built-in trainer (TensorFlow): each task its own GPUs")] + [
        ("1", "split: the built-in trainer (TensorFlow): each task its own GPUs")]
    plan = gpu_plan(mgpu, two_gpus, "--local", "2", "--legacy-keras", "--", "python3", "train.py")
    assert [visible for visible, _, _ in plan] == ["0", "1"] and plan[0][2].startswith("split: --legacy-keras")
    plan = gpu_plan(mgpu, two_gpus, "--local", "2", "--gpus-per-task", "1", "--", "python3", "train.py")
    assert [(visible, rule) for visible, _, rule in plan] == [("0", "split: --gpus-per-task 1"),
                                                              ("1", "split: --gpus-per-task 1")]


def test_hosts_without_gpus_or_uncounted_say_so(mgpu, gpus_on_path):
    plan = gpu_plan(mgpu, gpus_on_path(0), "--local", "2", "--", "python3", "train.py")
    assert plan == [("", "0", "none: this host has no GPU"), ("", "1", "none: this host has no GPU")]
    plan = gpu_plan(mgpu, gpus_on_path(0), "--workers", "h1,h2")
    assert [visible for visible, _, _ in plan] == [None, None]
    assert plan[0][2].startswith("as the host has them: its GPUs are not counted")
    text = mgpu("launch", "--local", "2", "--dry-run", "--", "python3", "train.py", env=gpus_on_path(2)).stdout
    assert "  GPUs:      every GPU: a program of its own" in text
