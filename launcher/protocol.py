"""The contract between the launcher and the programs it starts.

Both sides import this module, so it must stay free of heavy imports.
"""

import re

# TF_CONFIG task types mgpu plans, in planning order. The evaluator is not part of the cluster;
# parameter servers (ps) are, for ParameterServerStrategy, whose coordinator is the chief.
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TRAINING_TASK_TYPES = ("chief", "worker", "ps")
# The task types the built-in trainer (MultiWorkerMirroredStrategy) runs as.
TRAINER_TASK_TYPES = ("chief", "worker", "evaluator")

# A task that prints this line (alone, on stdout) tells the launcher it is ready:
# its strategy is built and it has joined the cluster.
READY_LINE = "MGPU_TASK_READY"

# Exit code for "preempted, checkpoint saved": always restartable.
EXIT_PREEMPTED = 42

# Environment the launcher sets for every task, besides TF_CONFIG.
ENV_RUN_ID = "MGPU_RUN_ID"  # tags every process of a run, so none can be left behind
ENV_TASK_TYPE = "MGPU_TASK_TYPE"
ENV_TASK_INDEX = "MGPU_TASK_INDEX"
ENV_ATTEMPT = "MGPU_ATTEMPT"  # 0 for the first start, then 1, 2, ... after restarts
# One hash of the files --sync copied (config/sync.py): the same in every task of a run that ran the same files.
ENV_SYNC_DIGEST = "MGPU_SYNC_DIGEST"
# The job's size as the run was planned: its members (chief and workers) and their hosts. A run that
# goes on with fewer hosts (--min-hosts) keeps them, while WORLD_SIZE and the like count the members
# left: a program keeps its global batch or scales its learning rate by the ratio.
ENV_WORLD_SIZE_MAX = "MGPU_WORLD_SIZE_MAX"
ENV_HOSTS_MAX = "MGPU_HOSTS_MAX"
# A random value of one launch, set at start (not in the plan). A run id may be used again once its
# launcher is gone (killed, or on another machine), so whatever stops processes by their tags (the
# sweeps, the reaper, a remote task's hang-up guard) looks for the run id and this value together:
# it never takes a later launch's processes for its own.
ENV_LAUNCH_ID = "MGPU_LAUNCH_ID"
# Where a failing task may write why it failed, as JSON (launcher/error_file.py); one path per task
# and attempt, in the run dir. Set at start for tasks on this machine only, not in the plan.
ENV_ERROR_FILE = "MGPU_ERROR_FILE"

# A task may report its progress with lines "MGPU_PROGRESS <step>/<total>" on stdout (total 0:
# unknown). The launcher shows them as a progress bar with rate and ETA; the log keeps the lines.
# Numbers are ASCII digits, at most PROGRESS_MAX_DIGITS of them; any other line is not progress.
PROGRESS_PREFIX = "MGPU_PROGRESS "
PROGRESS_MAX_DIGITS = 18
_PROGRESS = re.compile(rf"([0-9]{{1,{PROGRESS_MAX_DIGITS}}})/([0-9]{{1,{PROGRESS_MAX_DIGITS}}})")


def progress_line(step: int, total: int) -> str:
    return f"{PROGRESS_PREFIX}{int(step)}/{int(total)}"


def parse_progress(line: str) -> tuple[int, int] | None:
    """(step, total) of a progress line; None for any other line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    # Not str.isdigit(): it takes "²" and other digits that int() refuses.
    numbers = _PROGRESS.fullmatch(line[len(PROGRESS_PREFIX):].strip(" \t\r\n"))
    if numbers is None:
        return None
    return int(numbers.group(1)), int(numbers.group(2))


# A task may say that it has saved a checkpoint: "MGPU_CHECKPOINT <step>" (alone, on stdout). A
# host that is back since the run went on without it (--min-hosts) is taken back right after one,
# so that the restart that grows the cluster loses little work.
CHECKPOINT_PREFIX = "MGPU_CHECKPOINT "
_CHECKPOINT = re.compile(rf"[0-9]{{1,{PROGRESS_MAX_DIGITS}}}")


def checkpoint_line(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{int(step)}"


def parse_checkpoint(line: str) -> int | None:
    """The step of a checkpoint line; None for any other line."""
    if not line.startswith(CHECKPOINT_PREFIX):
        return None
    step = _CHECKPOINT.fullmatch(line[len(CHECKPOINT_PREFIX):].strip(" \t\r\n"))
    return int(step.group(0)) if step else None


# A task may say how its time went since its last such line: "MGPU_TIME_SPLIT <compute_ms> <wait_ms>"
# (alone, on stdout): milliseconds spent computing, and waiting for the other tasks (in a gradient
# exchange, say). In a synchronous job the task that waits least is the one the others wait for; the
# launcher takes these exact figures over its own CPU samples (the built-in trainer prints them).
TIME_SPLIT_PREFIX = "MGPU_TIME_SPLIT "
_TIME_SPLIT = re.compile(r"([0-9]{1,15}) ([0-9]{1,15})")


def time_split_line(compute_ms: int, wait_ms: int) -> str:
    return f"{TIME_SPLIT_PREFIX}{int(compute_ms)} {int(wait_ms)}"


def parse_time_split(line: str) -> tuple[int, int] | None:
    """(compute_ms, wait_ms) of a time-split line; None for any other line."""
    if not line.startswith(TIME_SPLIT_PREFIX):
        return None
    numbers = _TIME_SPLIT.fullmatch(line[len(TIME_SPLIT_PREFIX):].strip(" \t\r\n"))
    if numbers is None:
        return None
    return int(numbers.group(1)), int(numbers.group(2))

# What `keras.distribution.initialize()` reads (Keras 3 on the JAX backend); set for every task that
# is a member of the cluster, from the same addresses as TF_CONFIG.
ENV_KERAS_JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"  # the coordinator (process 0) first
ENV_KERAS_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
KERAS_DISTRIBUTION_ENV = (ENV_KERAS_JOB_ADDRESSES, ENV_KERAS_NUM_PROCESSES, ENV_KERAS_PROCESS_ID)
# JAX's cross-process collectives on CPU; set to "gloo" for tasks without GPUs.
ENV_JAX_CPU_COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"

# What PyTorch's env:// rendezvous reads (torch.distributed.init_process_group, torchrun's names):
# set for every member of the cluster. Process 0 (the chief, else worker 0) listens on its TF_CONFIG
# port as MASTER_PORT. LOCAL_RANK and LOCAL_WORLD_SIZE count the members on the same host.
ENV_TORCH_RANK = "RANK"
ENV_TORCH_WORLD_SIZE = "WORLD_SIZE"
ENV_TORCH_LOCAL_RANK = "LOCAL_RANK"
ENV_TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_TORCH_MASTER_ADDR = "MASTER_ADDR"
ENV_TORCH_MASTER_PORT = "MASTER_PORT"
# The rest of torchrun's contract, which torch and Lightning read to tell that a launcher started the
# process: torchrun's node is a host of the job (GROUP_RANK, numbered in the order of the job's members;
# NODE_RANK, the same, for Lightning's fallback), its one role "default" is every member (ROLE_RANK is
# RANK), TORCHELASTIC_RUN_ID is the run id, TORCHELASTIC_RESTART_COUNT the attempt (backends set it
# with ENV_ATTEMPT) and TORCHELASTIC_MAX_RESTARTS is --max-restarts.
ENV_TORCH_GROUP_RANK = "GROUP_RANK"
ENV_TORCH_GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
ENV_TORCH_NODE_RANK = "NODE_RANK"
ENV_TORCH_ROLE_NAME = "ROLE_NAME"
ENV_TORCH_ROLE_RANK = "ROLE_RANK"
ENV_TORCH_ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
ENV_TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
ENV_TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
ENV_TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
# Where torch's `@record` writes a failing process's error: the task's error file, beside ENV_ERROR_FILE.
ENV_TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
TORCH_ROLE = "default"  # torchrun's role name when none is given
TORCH_DISTRIBUTED_ENV = (ENV_TORCH_RANK, ENV_TORCH_WORLD_SIZE, ENV_TORCH_LOCAL_RANK, ENV_TORCH_LOCAL_WORLD_SIZE,
                         ENV_TORCH_MASTER_ADDR, ENV_TORCH_MASTER_PORT, ENV_TORCH_GROUP_RANK, ENV_TORCH_GROUP_WORLD_SIZE,
                         ENV_TORCH_NODE_RANK, ENV_TORCH_ROLE_NAME, ENV_TORCH_ROLE_RANK, ENV_TORCH_ROLE_WORLD_SIZE,
                         ENV_TORCHELASTIC_RUN_ID, ENV_TORCHELASTIC_RESTART_COUNT, ENV_TORCHELASTIC_MAX_RESTARTS)
# JAX's multi-process job, under the names Kubeflow Trainer's JAX runtime sets. jax.distributed.initialize()
# reads JAX_COORDINATOR_ADDRESS itself (JAX 0.4 to 0.10 at least); the count and the id are passed in.
ENV_JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
ENV_JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_JAX_PROCESS_ID = "JAX_PROCESS_ID"
JAX_DISTRIBUTED_ENV = (ENV_JAX_COORDINATOR_ADDRESS, ENV_JAX_NUM_PROCESSES, ENV_JAX_PROCESS_ID)
# Every name mgpu sets for each member of the job; a user's env may not set them.
JOB_ENV = KERAS_DISTRIBUTION_ENV + TORCH_DISTRIBUTED_ENV + JAX_DISTRIBUTED_ENV + (ENV_TORCHELASTIC_ERROR_FILE,)


def attempt_env(attempt: int) -> dict[str, str]:
    """What each attempt of a task adds to its planned env: its number, as mgpu's and torchrun's names."""
    return {ENV_ATTEMPT: str(attempt), ENV_TORCHELASTIC_RESTART_COUNT: str(attempt)}
