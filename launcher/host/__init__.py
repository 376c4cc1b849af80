"""This machine: its names, its GPUs, its free ports, its addresses and interfaces, its process trees,
and the files the user names (read with limits); and the probe (probe/), the program that answers
the same questions on every host of a launch.

Knows nothing of clusters or TF_CONFIG.
"""
