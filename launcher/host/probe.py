"""What a host can do for its tasks: a program that runs on the host being checked.

Standard library only and importing nothing of mgpu: `mgpu check` runs this file's source
with the task's Python on every host (over SSH for remote ones), and this machine's
launcher imports the same functions, so each question has one answer everywhere.

Run as: python probe.py PORTS MODULES [legacy-keras], with comma-separated lists; prints one
JSON object with the keys python, busy_ports, missing_modules, tensorflow or tensorflow_error,
gpus, and with legacy-keras also tf_keras or tf_keras_error.
"""

import json
import shutil
import socket
import subprocess
import sys


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


def count_gpus_in_listing(text):
    """The number of GPUs in the output of `nvidia-smi -L` ("GPU 0: ... (UUID: ...)" per line)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def gpu_count(timeout=10.0):
    """How many NVIDIA GPUs this host has; None without nvidia-smi, 0 if it fails or hangs."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-L"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return count_gpus_in_listing(done.stdout) if done.returncode == 0 else 0


def _first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


def probe(ports, modules, legacy_keras=False):
    out = {"python": "%d.%d.%d" % sys.version_info[:3]}
    out["busy_ports"] = [port for port in ports if port_in_use(port)]
    missing = []
    for name in modules:
        try:
            __import__(name)
        except Exception as e:
            missing.append("%s (%s)" % (name, _first_line(e)))
    out["missing_modules"] = missing
    try:
        import tensorflow
        out["tensorflow"] = tensorflow.__version__
    except Exception as e:
        out["tensorflow_error"] = _first_line(e)
    if legacy_keras:  # tf_keras, what `tf.keras` means with TF_USE_LEGACY_KERAS=1
        try:
            import tf_keras
            out["tf_keras"] = tf_keras.__version__
        except Exception as e:
            out["tf_keras_error"] = _first_line(e)
    out["gpus"] = gpu_count(timeout=20.0)
    return out


def main(argv):
    ports = [int(port) for port in argv[1].split(",") if port]
    modules = [name for name in argv[2].split(",") if name]
    result = probe(ports, modules, legacy_keras=argv[3:4] == ["legacy-keras"])
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
