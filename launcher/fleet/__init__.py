"""The run's hosts (a Fleet): the hosts in use, the spares left, the hosts left out and which host is
this machine, and the one way a host is made ready to run tasks (`Fleet.prepare`, the stages of
`stages.py`), for the first start, a spare that takes a host's tasks, and a slow host's swap.

launch.py makes the fleet of a run (`MachineFleet` for this machine and SSH hosts, `SlurmFleet` for
the nodes of an allocation) and hands it to the supervisor, which knows hosts only through what it
may ask of them (supervise.hosts.HostActions) and what the policy sees of them (FleetView)."""
