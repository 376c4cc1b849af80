"""examples/keras_fit_legacy.py with a pause of SECONDS after each epoch's backup in a run's first
attempt (MGPU_ATTEMPT 0): a test that acts on a task once it saw an epoch end does so before more
than a few others end, however fast they train; later attempts run at full speed.

Usage: python paced_keras_fit.py SECONDS EXAMPLE-OPTIONS... (with --legacy-keras: tf.keras is tf_keras)
"""

import os
import pathlib
import runpy
import sys
import time

from launcher.protocol import ENV_ATTEMPT

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "keras_fit_legacy.py"
pause = float(sys.argv.pop(1))
sys.modules.setdefault("jax", None)  # as the example does, before TensorFlow's import

import tensorflow as tf  # noqa: E402

if os.environ.get(ENV_ATTEMPT) == "0":
    backup_at_epoch_end = tf.keras.callbacks.BackupAndRestore.on_epoch_end

    def paced_epoch_end(self, epoch, logs=None):
        backup_at_epoch_end(self, epoch, logs)
        time.sleep(pause)

    tf.keras.callbacks.BackupAndRestore.on_epoch_end = paced_epoch_end

sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
