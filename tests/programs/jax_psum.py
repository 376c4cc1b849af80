"""A plain JAX multi-process program: one psum across the processes, repeated for HOLD seconds, or
until the file HOLD exists. Every process stops after the same round: the first to see the hold
over tells the others through the psum.

Only process 0 (the coordinator) listens; the others dial it. Usage: python jax_psum.py HOLD_SECONDS|HOLD_FILE
"""

import os
import sys
import time

import jax
import jax.numpy as jnp

from hold import hold_over  # beside this program

HOLD = sys.argv[1] if len(sys.argv) > 1 else "0"


def main() -> None:
    # JAX reads JAX_COORDINATOR_ADDRESS itself; the process count and id it takes as arguments.
    jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
    psum = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
    started = time.monotonic()
    rounds = 0
    while True:
        total = psum(jnp.ones(jax.local_device_count()))
        rounds += 1
        stops = psum(jnp.full(jax.local_device_count(), float(hold_over(HOLD, started))))
        if float(stops[0]) > 0:
            break
        time.sleep(0.5)
    print(f"process {jax.process_index()}: psum {float(total[0]):g} after {rounds} rounds", flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
