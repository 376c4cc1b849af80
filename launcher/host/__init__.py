"""This machine: its names, its GPUs, its free ports, its process trees, and the files the user
names (read with limits).

Knows nothing of clusters or TF_CONFIG.
"""
