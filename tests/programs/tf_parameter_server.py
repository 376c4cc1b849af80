"""TensorFlow's parameter-server training, as the tutorial (tensorflow/docs parameter_server_training)
writes it: workers and parameter servers run a `tf.distribute.Server` and serve until stopped; the
chief builds ParameterServerStrategy and trains a tf_keras model with `model.fit`. Run with
TF_USE_LEGACY_KERAS=1 (mgpu's --legacy-keras): Keras 3 has no ParameterServerStrategy support."""

import json
import os
import sys

import tensorflow as tf

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 4

tf_config = json.loads(os.environ["TF_CONFIG"])
task = tf_config["task"]
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

if task["type"] in ("worker", "ps"):
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=task["type"],
                                  task_index=task["index"], protocol=cluster_resolver.rpc_layer or "grpc",
                                  start=True)
    print(f"{task['type']}:{task['index']} serving", flush=True)
    server.join()  # for ever: the launcher stops it once the chief is done

strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(learning_rate=0.1), loss="mse", steps_per_execution=1)


def dataset_fn(input_context):
    x = tf.random.stateless_uniform((64, 4), seed=(1, 2))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)


history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=STEPS,
                    verbose=0)
used = {v.device for v in model.trainable_variables}
print(f"chief: trained {2 * STEPS} steps, loss {history.history['loss'][-1]:.4f}, variables on {sorted(used)}",
      flush=True)
