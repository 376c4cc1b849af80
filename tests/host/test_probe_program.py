"""The probe as it reaches a host: one source, made of the modules of launcher.host.probe.SHIPPED,
that runs with a Python that has nothing of mgpu and only its standard library."""

import ast
import json
import subprocess
import sys

from launcher.host.probe import HOST_FOLDER, SHIPPED, SHIPPED_IMPORT, probe_source

# -I: no PYTHONPATH, no working directory on the path; -S: no site-packages (where mgpu is installed here).
BARE = [sys.executable, "-I", "-S"]


def _modules():
    return {name: ast.parse((HOST_FOLDER / name).read_text(encoding="utf-8")) for name in SHIPPED}


def test_the_one_source_runs_where_mgpu_is_not_installed(tmp_path):
    assert subprocess.run([*BARE, "-c", "import launcher"], cwd=tmp_path, capture_output=True).returncode != 0
    done = subprocess.run([*BARE, "-c", probe_source(), "", ""], cwd=tmp_path, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["python"] == "%d.%d.%d" % sys.version_info[:3] and answer["busy_ports"] == []


def test_a_shipped_module_imports_the_standard_library_and_other_shipped_modules_only():
    shipped = {"launcher.host." + name.removesuffix(".py").replace("/", ".") for name in SHIPPED}
    for name, tree in _modules().items():
        for node in tree.body:  # numpy, torch and TensorFlow are imported inside functions only
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher"):
                assert node.module in shipped and node.module != "launcher.host.probe", (name, node.module)
                assert SHIPPED.index(name) > SHIPPED.index(node.module.removeprefix("launcher.host.").replace(".", "/")
                                                           + ".py"), (name, "imports a module shipped after it")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
                assert {m.split(".")[0] for m in modules} <= sys.stdlib_module_names, (name, modules)
    # Each import of a shipped module is left out of the one source: none is left in it.
    tree = ast.parse(probe_source())
    assert not [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("launcher")]
    assert not SHIPPED_IMPORT.search(probe_source())


def test_no_two_shipped_modules_define_one_name():
    """In the one source a second definition would take the first's place, for both modules."""
    defined: dict[str, str] = {}
    for name, tree in _modules().items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
            else:
                continue
            for defined_name in names:
                assert defined_name not in defined, (defined_name, defined[defined_name], name)
                defined[defined_name] = name
