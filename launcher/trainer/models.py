"""The classifiers, as Keras models producing logits."""

from __future__ import annotations

import keras

from launcher.trainer.datasets import IMAGE_SHAPE, NUM_CLASSES


def build(name: str) -> keras.Model:
    # Dense layers carry no activation of their own (a ReLU layer follows) so that their
    # pre-activation output, which the factored gradient exchange needs, is a layer output.
    layers = keras.layers
    if name == "cnn":
        body = [
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2D(64, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(1024),
            layers.ReLU(),
            layers.Dropout(0.4),
        ]
    elif name == "small":
        # No dropout: runs are exactly reproducible, which the tests rely on.
        body = [
            layers.Conv2D(8, 3, activation="relu"),
            layers.MaxPooling2D(2),
            layers.Flatten(),
            layers.Dense(32),
            layers.ReLU(),
        ]
    else:
        raise ValueError(f"unknown model {name!r}")
    # Logits stay float32 under a mixed-precision policy, for a stable loss.
    head = layers.Dense(NUM_CLASSES, dtype="float32")
    return keras.Sequential([keras.Input((*IMAGE_SHAPE, 1)), *body, head], name=name)
