"""This machine: its names, its GPUs, its free ports, and its process trees.

Knows nothing of clusters or TF_CONFIG.
"""
