"""Whether a port is in use, as a task's server would find it.

Standard library only, importing nothing of mgpu: the probe (launcher/host/probe/) ships this
source to every host, so a port is judged busy there as it is here (free ports to hand out:
ports.py).
"""

import socket


def port_in_use(port, host="127.0.0.1"):
    """True when a server could not listen on `port` the way TensorFlow does.

    TensorFlow binds every address with SO_REUSEADDR, so a port held only by
    connections in TIME_WAIT counts as free; a listener on any address does not.
    """
    family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((wildcard, port))
            sock.listen()
        except OSError:
            return True
    return False
