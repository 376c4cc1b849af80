"""A plain JAX program across processes, launched by mgpu: the psum of JAX's multi-process docs.

    mgpu launch --local 2 -- python examples/jax_psum.py
    mgpu launch --workers h1:2222,h2:2222 -- python3 jax_psum.py

mgpu sets, for every chief and worker task, JAX_COORDINATOR_ADDRESS (process 0's TF_CONFIG
address, where it starts the coordinator), JAX_NUM_PROCESSES and JAX_PROCESS_ID, and on hosts
without GPUs JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo. jax.distributed.initialize() reads the
coordinator itself; the process count and id are passed in (JAX reads them from no variable).
Each process prints `psum <total> over <n> processes`: the sum of every process's id + 1.
"""

import os

import jax
import jax.numpy as jnp

jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))

# One value per local device, each process's id + 1; psum adds them across every device of the job.
values = jnp.full(jax.local_device_count(), jax.process_index() + 1.0)
total = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(values)
print(f"process {jax.process_index()}: psum {float(total[0]):g} over {jax.process_count()} processes, "
      f"{jax.device_count()} devices", flush=True)
jax.distributed.shutdown()
