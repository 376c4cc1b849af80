"""Programs that run where the tasks run, before each task's program: the Slurm step's task
(`slurm_task.py`, started by srun on every node) and a Kubernetes pod's (`k8s_pod.py`). Each works
out its task's plan there, from what the scheduler says, and then becomes the task's program."""
