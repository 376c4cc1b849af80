"""What a command asked for, read in: the requests the command line made, turned into a cluster spec
and plans with what only this machine knows (files, its names and GPUs, the ssh config)."""
