"""Export of the trained model as a TensorFlow SavedModel with a `serve` endpoint."""

from __future__ import annotations

import keras

from launcher.trainer import models


def export(model: keras.Model, model_name: str, export_dir: str) -> None:
    """Call outside strategy.scope(): the copy holds plain variables, loadable anywhere."""
    plain = models.build(model_name)
    plain.set_weights(model.get_weights())
    plain.export(export_dir, format="tf_saved_model", verbose=False)
