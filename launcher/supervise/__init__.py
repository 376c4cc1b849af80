"""Running a plan to its end: start, watch, fail fast, restart, stop, and record what happened.

Knows TensorFlow only through diagnosis, and processes only through the backends (it imports
nothing from launcher/host).
"""
