"""This host's addresses by interface, and which interface holds an address or sends toward a host:
the interface NCCL and Gloo must use.

Standard library only, importing nothing of mgpu: the probe (launcher/host/probe/) ships this
source to every host, where the reachability test lists the host's addresses, and a Slurm node or
a pod (bootstrap/) finds its own interface with it.
"""

import ipaddress
import shutil
import socket
import subprocess


def _addresses_from_ip_command():
    """[(address, interface)] from iproute2's one-line listing; [] without it."""
    if shutil.which("ip") is None:
        return []
    try:
        listing = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in listing.splitlines():  # "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0 ..."
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
            found.append((fields[3].split("/")[0], fields[1].split("@")[0]))
    return found


def _addresses_from_ioctl():
    """[(address, interface)] of each interface's first IPv4 address, asked of the kernel (Linux)."""
    try:
        import fcntl
        import struct
        names = [name for _, name in socket.if_nameindex()]
    except (ImportError, OSError):
        return []
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                answer = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address
            found.append((socket.inet_ntoa(answer[20:24]), name))
    return found


def local_addresses():
    """[(address, interface)] of this host: every address with iproute2, else each interface's
    first IPv4 address."""
    return _addresses_from_ip_command() or _addresses_from_ioctl()


def interface_holding(ips, addresses):
    """The interface, from [(address, interface)], that holds one of `ips` (tried in order); None
    when none does (a NAT address, say)."""
    held = {}
    for address, name in addresses:
        try:
            held.setdefault(ipaddress.ip_address(address.split("%")[0]), name)
        except ValueError:
            continue
    for value in ips:
        try:
            wanted = ipaddress.ip_address(value.split("%")[0])
        except ValueError:
            continue
        if wanted in held:
            return held[wanted]
        if wanted.is_loopback:  # all of 127.0.0.0/8 is the loopback interface's, listed or not
            loopback = [name for address, name in held.items() if address.is_loopback and address.version == wanted.version]
            if loopback:
                return loopback[0]
    return None


def source_address_toward(host):
    """The address this host sends from to reach `host` (the kernel's route; no packet is sent);
    None when `host` does not resolve or is not routed."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            return sock.getsockname()[0]
    except (OSError, UnicodeError, IndexError):
        return None


def interface_toward(hosts, own):
    """The interface this host sends from to reach the first of `hosts` that is not `own` (`own`
    itself when all are: not the address this host resolves its own name to, which on Debian is
    127.0.1.1); None when that host does not resolve or is not routed, or no interface holds the
    address."""
    peer = next((host for host in hosts if host != own), own)
    source = source_address_toward(peer)
    return interface_holding([source], local_addresses()) if source else None
