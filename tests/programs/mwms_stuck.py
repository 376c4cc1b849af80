"""A MultiWorkerMirroredStrategy custom loop whose worker STUCK_TASK blocks in Python (a
deadlocked input pipeline) after STUCK_AFTER steps, its process alive: TensorFlow's heartbeats go
on and the other workers wait in the next all-reduce forever. A stall watchdog's test subject.

Usage: python mwms_stuck.py [STUCK_TASK [STUCK_AFTER]]   (STUCK_TASK -1: nobody blocks)
"""

import json
import os
import sys
import threading

import tensorflow as tf

STUCK_TASK = int(sys.argv[1]) if len(sys.argv) > 1 else 1
STUCK_AFTER = int(sys.argv[2]) if len(sys.argv) > 2 else 3


def next_batch(step: int) -> tf.Tensor:
    if step == STUCK_AFTER and json.loads(os.environ["TF_CONFIG"])["task"]["index"] == STUCK_TASK:
        print(f"step {step}: the input pipeline deadlocks", flush=True)
        threading.Event().wait()  # never returns
    return tf.ones([8, 4])


def main() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        weights = tf.Variable(tf.zeros([4, 1]))

    @tf.function
    def train_step(batch):
        def replica_step(x):
            grad = tf.reduce_mean(x, axis=0, keepdims=True)
            grad = tf.distribute.get_replica_context().all_reduce("sum", tf.transpose(grad))
            weights.assign_sub(0.01 * grad)
        strategy.run(replica_step, args=(batch,))

    for step in range(1000 if STUCK_TASK >= 0 else STUCK_AFTER):
        train_step(next_batch(step))
        print(f"step {step} done", flush=True)


if __name__ == "__main__":
    main()
