"""Parameter-server training (the tutorial's tf_keras `model.fit` with ParameterServerStrategy) that
loses a worker while the chief trains: worker:1's first process ends with code 3 once the chief has
ended its first epoch (the file FOLDER/training); a later one serves (FOLDER/worker-1.back). After
that first epoch of two steps the chief waits, up to WAIT_SECONDS, for the worker to be back, then
trains on to EPOCHS (ParameterServerStrategy takes no batch-level callbacks). Run with
TF_USE_LEGACY_KERAS=1 (--legacy-keras).

Usage: python tf_ps_worker_lost.py FOLDER EPOCHS WAIT_SECONDS"""

import json
import os
import pathlib
import sys
import time

import tensorflow as tf

FOLDER = pathlib.Path(sys.argv[1])
EPOCHS = int(sys.argv[2])
WAIT_SECONDS = float(sys.argv[3])

tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

if task["type"] in ("worker", "ps"):
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=task["type"],
                                  task_index=task["index"], protocol=cluster_resolver.rpc_layer or "grpc",
                                  start=True)
    first_life = not (FOLDER / f"{task['type']}-{task['index']}.started").exists()
    (FOLDER / f"{task['type']}-{task['index']}.started").touch()
    print(f"{task['type']}:{task['index']} serving", flush=True)
    if not first_life:
        (FOLDER / f"{task['type']}-{task['index']}.back").touch()
    if task["type"] == "worker" and task["index"] == 1 and first_life:
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


class Paced(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            (FOLDER / "training").touch()
            deadline = time.monotonic() + WAIT_SECONDS
            while not (FOLDER / "worker-1.back").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            print(f"chief: worker:1 back: {(FOLDER / 'worker-1.back').exists()}", flush=True)


history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS, steps_per_epoch=2,
                    verbose=0, callbacks=[Paced()])
print(f"chief: trained {2 * EPOCHS} steps, loss {history.history['loss'][-1]:.4f}", flush=True)
