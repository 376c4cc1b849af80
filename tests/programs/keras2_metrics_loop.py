"""The epoch loop of TensorFlow's custom-training tutorial (tensorflow/docs, distribute/custom_training),
as it is written: for Keras 2. At the end of each epoch it resets its metrics with
`reset_states()`, which Keras 3 (tf.keras from TensorFlow 2.16 on, without TF_USE_LEGACY_KERAS)
calls `reset_state()`: the first epoch's end raises AttributeError."""

import tensorflow as tf

train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

for epoch in range(2):
    train_accuracy.update_state([1, 0], [[0.2, 0.8], [0.6, 0.4]])
    test_accuracy.update_state([0], [[0.3, 0.7]])
    print(f"Epoch {epoch + 1}, Accuracy: {train_accuracy.result() * 100}, "
          f"Test Accuracy: {test_accuracy.result() * 100}", flush=True)
    test_accuracy.reset_states()
    train_accuracy.reset_states()
