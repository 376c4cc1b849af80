"""Output a task controls: escape sequences reach the logs raw and the console neutralised."""

import dataclasses
import sys

from supervisor_helpers import make_plans, supervise_plans

FORGER = (
    "import sys\n"
    "sys.stdout.buffer.write(b'\\x1b]0;owned\\x07title\\n')\n"
    "sys.stdout.buffer.write(b'progress\\r[mgpu] all tasks succeeded\\x1b[2K\\n')\n"
    "sys.stdout.buffer.write(b'tab\\tstays \\xe2\\x80\\xaereversed\\n')\n"
)


def test_control_sequences_are_neutralised_on_the_console_and_kept_in_the_log(run_id, tmp_path):
    [plan] = make_plans(run_id, [], workers=1)
    plan = dataclasses.replace(plan, argv=(sys.executable, "-c", FORGER))
    result = supervise_plans([plan], run_id, tmp_path)
    assert result.error is None
    console = result.console.splitlines()
    assert "[worker:0] \\x1b]0;owned\\x07title" in console
    assert "[worker:0] [mgpu] all tasks succeeded\\x1b[2K" in console  # the last state of a redrawn line
    assert "[worker:0] tab\tstays \\u202ereversed" in console
    assert not any(c in result.console for c in "\x1b\r\x07\u202e")
    log = (result.run_dir / "worker-0.log").read_bytes()
    assert log == (b"\x1b]0;owned\x07title\nprogress\r[mgpu] all tasks succeeded\x1b[2K\n"
                   b"tab\tstays \xe2\x80\xaereversed\n")
