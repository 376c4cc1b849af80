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

# What `keras.distribution.initialize()` reads (Keras 3 on the JAX backend); set for every task that
# is a member of the cluster, from the same addresses as TF_CONFIG.
ENV_KERAS_JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"  # the coordinator (process 0) first
ENV_KERAS_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_KERAS_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
KERAS_DISTRIBUTION_ENV = (ENV_KERAS_JOB_ADDRESSES, ENV_KERAS_NUM_PROCESSES, ENV_KERAS_PROCESS_ID)
# JAX's cross-process collectives on CPU; set to "gloo" for tasks without GPUs.
ENV_JAX_CPU_COLLECTIVES = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
