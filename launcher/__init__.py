"""mgpu: launch and supervise multi-worker TensorFlow training."""

__version__ = "0.1.0"
