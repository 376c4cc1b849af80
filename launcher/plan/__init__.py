"""From a cluster spec to one plan per task: TF_CONFIG, argv, env, devices; and their rendering.

Pure: whatever needs I/O (local host names, GPU counts) is passed in.
"""
