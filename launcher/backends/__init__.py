"""Backends that start tasks: local processes or processes over SSH."""
