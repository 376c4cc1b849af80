"""Read the TF_CONFIG that `mgpu launch` sets, for programs that are not TensorFlow.

mgpu plans the cluster and starts one process per task; any framework can use what it
writes. This program needs only the standard library: it derives what most frameworks ask
for (rank, world size, the address of rank 0) and prints it.

    mgpu launch --local 2 -- python examples/tf_config_reader.py
    mgpu launch --workers h1:2222,h2:2222 -- python3 tf_config_reader.py

For example, with PyTorch: torch.distributed.init_process_group("gloo",
init_method=f"tcp://{coordinator}", rank=rank, world_size=world_size); use a port of its
own, not the one TF_CONFIG gives rank 0, if TensorFlow also runs there.
"""

import json
import os
import sys


def cluster_from_environment(environ=os.environ):
    """(rank, world size, members in rank order, this task's type) from TF_CONFIG.

    Ranks follow TensorFlow's order: the chief (if any) first, then the workers. The
    evaluator is not a cluster member: its rank is None.
    """
    config = json.loads(environ["TF_CONFIG"])
    cluster = config.get("cluster", {})
    members = [("chief", address) for address in cluster.get("chief", [])]
    members += [("worker", address) for address in cluster.get("worker", [])]
    task_type, index = config["task"]["type"], int(config["task"]["index"])
    if task_type == "evaluator":
        return None, len(members), members, task_type
    rank = [i for i, (role, _) in enumerate(members) if role == task_type][index]
    return rank, len(members), members, task_type


def main():
    if "TF_CONFIG" not in os.environ:
        print("TF_CONFIG is not set: run this under `mgpu launch`", file=sys.stderr)
        return 2
    rank, world_size, members, task_type = cluster_from_environment()
    coordinator = members[0][1]
    print(f"reader: {task_type} rank {rank} of {world_size}; rank 0 is {coordinator}; "
          f"attempt {os.environ.get('MGPU_ATTEMPT', '0')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
