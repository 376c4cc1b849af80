"""What the user asked for: addresses, the cluster spec, spec files, hostfiles and env files.

Pure: parsing and checking only, no I/O beyond the text handed in, no DNS, no environment.
"""
