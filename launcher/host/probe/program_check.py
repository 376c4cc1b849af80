"""The probe's look at the task's own program: which interpreter runs it, the modules its script
imports that this interpreter cannot find, and what this host's own name resolves to. Part of
the probe's program (shipped as source: see __init__.py); standard library only.

A script's imports are read, not run: its top-level `import` and `from ... import` statements
(also under a top-level `if` or `with`, not under `try`, where a program handles a module that
is missing, nor in functions), each first name looked up with importlib's find_spec, which
imports nothing of it (torch or TensorFlow would take seconds). The script's folder comes first
on the path, as when Python runs it.
"""

import ast
import importlib.util
import os
import socket
import sys

SCRIPT_LIMIT = 2 << 20  # bytes of a script that are read; a larger one is not looked into
IMPORTS_LIMIT = 200  # names of modules looked up
ADDRESSES_LIMIT = 16  # addresses of the host's own name reported


def _top_level_imports(tree):
    """The first names of the modules `tree`'s top-level statements import, in order, once each."""
    names = []
    pending = list(tree.body)
    while pending and len(names) < IMPORTS_LIMIT:
        node = pending.pop(0)
        if isinstance(node, ast.Import):
            found = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found = [node.module.split(".")[0]]
        else:
            found = []
            if isinstance(node, ast.If):
                pending[:0] = node.body + node.orelse
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                pending[:0] = node.body
        for name in found:
            if name not in names and name != "__future__":
                names.append(name)
    return names[:IMPORTS_LIMIT]


def _keras_backend(tree):
    """The Keras backend a script's top level sets for itself (`os.environ["KERAS_BACKEND"] = "jax"`,
    or with setdefault), or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and getattr(target.slice, "value", None) == "KERAS_BACKEND":
                    return str(node.value.value)[:20]
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and len(node.value.args) == 2
                and all(isinstance(arg, ast.Constant) for arg in node.value.args)
                and node.value.args[0].value == "KERAS_BACKEND"):
            return str(node.value.args[1].value)[:20]
    return None


def _read_script(script):
    """`script`'s syntax tree, or None where it cannot be read or parsed (Python itself then says
    why when the task starts)."""
    try:
        with open(script, "rb") as f:
            source = f.read(SCRIPT_LIMIT + 1)
        if len(source) > SCRIPT_LIMIT:
            return None
        return ast.parse(source, script)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _not_found(names):
    """Those of `names` this interpreter finds no module for."""
    missing = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def program_check(script=None, module=None):
    """The interpreter's own path, and with `script` (a path) or `module` (python -m's), the modules
    the program needs that it cannot find: imports (what was looked up) and
    imports_missing (not found), and keras_backend where the script sets KERAS_BACKEND itself."""
    out = {"executable": os.path.abspath(sys.executable or "")}  # a venv's own path, not its base's
    names = None
    if script:
        tree = _read_script(script)
        if tree is not None:
            names = _top_level_imports(tree)
            backend = _keras_backend(tree)
            if backend is not None:
                out["keras_backend"] = backend
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    elif module:
        names = [module.split(".")[0]]
        sys.path.insert(0, os.getcwd())
    if names is not None:
        out["imports"] = names
        out["imports_missing"] = _not_found(names)
    return out


def own_name_check():
    """This host's own name and the addresses its resolver gives for it: where Gloo, left to
    itself, listens (JAX's collectives always are)."""
    name = socket.gethostname()
    out = {"own_name": name[:100], "own_addresses": []}
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        out["own_name_error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
        return out
    for info in infos:
        address = info[4][0]
        if address not in out["own_addresses"] and len(out["own_addresses"]) < ADDRESSES_LIMIT:
            out["own_addresses"].append(address)
    return out
