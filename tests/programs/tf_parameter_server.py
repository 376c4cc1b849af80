"""TensorFlow's parameter-server training, as the tutorial (tensorflow/docs parameter_server_training)
writes it: workers and parameter servers run a `tf.distribute.Server` and serve until stopped; the
chief builds ParameterServerStrategy and trains a tf_keras model with `model.fit`, two epochs of
STEPS steps. Run with TF_USE_LEGACY_KERAS=1 (mgpu's --legacy-keras): Keras 3 has no
ParameterServerStrategy support.

With FOLDER, a worker is lost while the chief trains: worker:1's first process ends with code 3
once the chief has ended its first epoch (the file FOLDER/training); a later one serves
(FOLDER/worker-1.back). After that first epoch the chief waits, up to WAIT_SECONDS, for the worker
to be back, then trains its second (ParameterServerStrategy takes no batch-level callbacks).

Usage: python tf_parameter_server.py STEPS [FOLDER WAIT_SECONDS]"""

import json
import os
import pathlib
import sys
import time

import tensorflow as tf

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
FOLDER = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else None
WAIT_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0

tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

if task["type"] in ("worker", "ps"):
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=task["type"],
                                  task_index=task["index"], protocol=cluster_resolver.rpc_layer or "grpc",
                                  start=True)
    first_life = True
    if FOLDER is not None:
        started = FOLDER / f"{task['type']}-{task['index']}.started"
        first_life = not started.exists()
        started.touch()
    print(f"{task['type']}:{task['index']} serving", flush=True)
    if FOLDER is not None and not first_life:
        (FOLDER / f"{task['type']}-{task['index']}.back").touch()
    if FOLDER is not None and task["type"] == "worker" and task["index"] == 1 and first_life:
        while not (FOLDER / "training").exists():
            time.sleep(0.05)
        print("worker:1 lost", flush=True)
        os._exit(3)
    server.join()  # for ever: the launcher stops it once the chief is done

strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse", steps_per_execution=1)


def dataset_fn(input_context):
    x = tf.random.stateless_uniform((64, 4), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)


class WorkerLost(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            (FOLDER / "training").touch()
            deadline = time.monotonic() + WAIT_SECONDS
            while not (FOLDER / "worker-1.back").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            print(f"chief: worker:1 back: {(FOLDER / 'worker-1.back').exists()}", flush=True)


history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=STEPS,
                    verbose=0, callbacks=[WorkerLost()] if FOLDER is not None else [])
used = {v.device for v in model.trainable_variables}
print(f"chief: trained {2 * STEPS} steps, loss {history.history['loss'][-1]:.4f}, variables on {sorted(used)}",
      flush=True)
# Once a worker was restarted, TensorFlow's ClusterCoordinator may abort the chief's exit (SIGABRT:
# "Unable to find a context_id matching the specified one ... Perhaps the worker was restarted") on a
# closure it had sent to the worker's earlier process, after model.fit has returned (seen once in seven
# full runs of the test suite): the chief's work is done here, and it leaves without that teardown.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
