"""Tasks on other hosts over SSH: targets and ssh-config, host keys, connections, streams.

Only the modules under this package import paramiko; `options` does not, so the CLI can build them.
"""
