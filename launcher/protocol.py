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
