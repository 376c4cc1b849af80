"""The contract between the launcher and the programs it starts.

Both sides import this module, so it must stay free of heavy imports.
"""

# TF_CONFIG task types mgpu plans, in planning order. The evaluator is not part of the cluster.
TASK_TYPES = ("chief", "worker", "evaluator")
TRAINING_TASK_TYPES = ("chief", "worker")

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
# Where a failing task may write why it failed, as JSON (launcher/error_file.py); one path per task
# and attempt, in the run dir. Set at start for tasks on this machine only, not in the plan.
ENV_ERROR_FILE = "MGPU_ERROR_FILE"

# A task may report its progress with lines "MGPU_PROGRESS <step>/<total>" on stdout (total 0:
# unknown). The launcher shows them as a progress bar with rate and ETA; the log keeps the lines.
PROGRESS_PREFIX = "MGPU_PROGRESS "


def progress_line(step: int, total: int) -> str:
    return f"{PROGRESS_PREFIX}{int(step)}/{int(total)}"


def parse_progress(line: str) -> tuple[int, int] | None:
    """(step, total) of a progress line; None for any other line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    step, _, total = line[len(PROGRESS_PREFIX):].strip().partition("/")
    if not (step.isdigit() and total.isdigit()):
        return None
    return int(step), int(total)


# What `keras.distribution.initialize()` reads (Keras 3 on the JAX backend); set for every task that
# is a member of the cluster, from the same addresses as TF_CONFIG.
ENV_KERAS_JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"  # the coordinator (process 0) first
ENV_KERAS_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
KERAS_DISTRIBUTION_ENV = (ENV_KERAS_JOB_ADDRESSES, ENV_KERAS_NUM_PROCESSES, ENV_KERAS_PROCESS_ID)
# JAX's cross-process collectives on CPU; set to "gloo" for tasks without GPUs.
ENV_JAX_CPU_COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
