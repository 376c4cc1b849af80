"""The probe's host check: what a host offers the tasks (their Python, modules, TensorFlow, free
ports, GPUs). Part of the probe's program (shipped as source: see __init__.py)."""

import os
import shutil
import sys

from launcher.host.gpus import gpu_count
from launcher.host.packages import NOT_INSTALLED, installed_tensorflow_version, installed_version
from launcher.host.ports_in_use import port_in_use
from launcher.host.probe.program_check import own_name_check, program_check


def error_line(error):
    """An error's first line, cut to 200 characters: what an answer says of a failure."""
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


def host_check(ports, modules, legacy_keras=False, import_tensorflow=True):
    """The host check's answer (see main.py): the Python, the busy ports, the modules that do not
    import, TensorFlow's and tf_keras's versions or why there are none, the GPUs."""
    out = {"python": "%d.%d.%d" % sys.version_info[:3]}
    out["busy_ports"] = [port for port in ports if port_in_use(port)]
    missing = []
    for name in modules:
        try:
            __import__(name)
        except Exception as e:
            missing.append("%s (%s)" % (name, error_line(e)))
    out["missing_modules"] = missing
    if import_tensorflow:
        try:
            import tensorflow
            out["tensorflow"] = tensorflow.__version__
        except Exception as e:
            out["tensorflow_error"] = error_line(e)
    else:
        version = installed_tensorflow_version()
        if version:
            out["tensorflow"] = version
        else:
            out["tensorflow_error"] = NOT_INSTALLED
    if legacy_keras and import_tensorflow:  # tf_keras, what `tf.keras` means with TF_USE_LEGACY_KERAS=1
        try:
            import tf_keras
            out["tf_keras"] = tf_keras.__version__
        except Exception as e:
            out["tf_keras_error"] = error_line(e)
    elif legacy_keras:  # importing tf_keras imports TensorFlow
        version = installed_version(("tf-keras",))
        if version:
            out["tf_keras"] = version
        else:
            out["tf_keras_error"] = NOT_INSTALLED
    out["gpus"] = gpu_count(timeout=20.0)
    out["py_spy"] = py_spy_path()
    return out


def py_spy_path():
    """Where `mgpu stacks` finds py-spy on this host: on PATH, or beside the tasks' Python; "" if nowhere."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else "")


def host_check_of(args):
    """The host check of PORTS MODULES [flags]."""
    ports = [int(port) for port in args[0].split(",") if port]
    modules = [name for name in args[1].split(",") if name]
    flags = args[2:]
    out = host_check(ports, modules, legacy_keras="legacy-keras" in flags,
                     import_tensorflow="import-tensorflow" in flags)
    # The task's own program (script=PATH or module=NAME), and with own-name what this host's name resolves to.
    program = dict(flag.split("=", 1) for flag in flags if flag.startswith(("script=", "module=")))
    if "program" in flags or program:
        out.update(program_check(program.get("script"), program.get("module")))
    # Only JAX (itself, or under Keras) needs the name: a slow resolver costs other programs nothing.
    if "own-name" in flags and {"jax", "keras"} & set(out.get("imports", ())):
        out.update(own_name_check())
    return out
