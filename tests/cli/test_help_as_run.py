"""What the help and the docs show is what runs: the run ids in their examples have the shape
`mgpu launch` gives one (the time and 32 random hex digits), and --no-check says that it leaves
each task's NCCL and Gloo interface unset, which a real launch with and without it shows."""

import re
import sys

import click

from launching import REPO, run_mgpu
from launcher.cli.main import cli
from launcher.intake.load import new_run_id

RUN_ID_SHAPE = re.compile(r"\d{8}-\d{6}-[0-9a-f]{32}")
# Something shown as a whole default run id: the time, then a suffix. The time alone is a run id's
# start, which `mgpu status` and the others take as well. A stamp inside a file's name
# (stacks-20260102-030405-1a2b3c4d.txt) is not a run id.
SHOWN_RUN_ID = re.compile(r"(?<![-\w])\d{8}-\d{6}-[0-9A-Za-z]+\b")


def help_texts(command: click.Command, name: str, parent: click.Context | None = None):
    context = click.Context(command, info_name=name, parent=parent)
    yield name, command.get_help(context)
    if isinstance(command, click.Group):
        for sub_name, sub in command.commands.items():
            yield from help_texts(sub, sub_name, context)


def test_run_ids_shown_in_the_help_and_the_docs_are_as_launch_makes_them():
    assert RUN_ID_SHAPE.fullmatch(new_run_id())
    shown = [(f"mgpu {name} --help", text) for name, text in help_texts(cli, "mgpu")]
    shown += [(str(page.relative_to(REPO)), page.read_text()) for page in sorted((REPO / "docs").glob("*.md"))]
    shown += [("README.md", (REPO / "README.md").read_text())]
    wrong = [(where, found) for where, text in shown for found in SHOWN_RUN_ID.findall(text)
             if not RUN_ID_SHAPE.fullmatch(found)]
    assert wrong == []
    assert any(SHOWN_RUN_ID.search(text) for _, text in shown)  # the test looks where they are


def interfaces(tmp_path, *options: str) -> set[str]:
    program = "import os; print('ifnames', os.environ.get('GLOO_SOCKET_IFNAME'), os.environ.get('NCCL_SOCKET_IFNAME'))"
    done = run_mgpu("launch", "--local", "2", *options, "--log-dir", str(tmp_path / "runs"),
                    "--", sys.executable, "-c", program, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {line.split(" ", 1)[1] for line in done.stdout.splitlines() if " ifnames " in line}


def test_no_check_says_it_leaves_nccl_and_gloo_to_choose_and_so_it_does(tmp_path):
    launch = cli.commands["launch"]
    [option] = [param for param in launch.params if "--no-check" in param.opts]
    assert "GLOO_SOCKET_IFNAME" in option.help and "NCCL_SOCKET_IFNAME" in option.help, option.help
    assert "--no-check" in (REPO / "docs" / "gpu-clusters.md").read_text()
    checked = interfaces(tmp_path)
    assert len(checked) == 1 and "None" not in next(iter(checked)), checked  # the checks chose one
    assert interfaces(tmp_path, "--no-check") == {"ifnames None None"}
