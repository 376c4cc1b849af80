"""Where `mgpu report` reads and writes: a run's folder, read as `mgpu status` reads it
(supervise/run_files.py), and the page and its trace.

By default the page and the trace go into the run's folder (REPORT_NAME, TRACE_NAME), made through
its descriptor, never through a link, and replaced whole (a new file renamed over the old), so the
page's links to the tasks' logs are relative and the folder can be copied or mailed as it is. With
`-o FILE` the page is FILE, the trace is beside it (FILE's name with TRACE_SUFFIX), and the links
to the logs are file: URIs of the run's folder.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import stat

from launcher.errors import UsageError
from launcher.report import page, story, trace
from launcher.supervise import run_files, samples
from launcher.supervise.console_text import console_safe
from launcher.supervise.rundir import CHECKS, MAX_CHECKS_BYTES
from launcher.supervise.runs import Run

REPORT_NAME = "report.html"
TRACE_NAME = "trace.json"
TRACE_SUFFIX = ".trace.json"
CHECKS_NAME = CHECKS  # the host checks' table a launch keeps: `mgpu check --json`'s output, or its "hosts" rows
MAX_SAMPLES_BYTES = 8 << 20  # of samples.jsonl, its end: what a launch writes is far less (samples.py)


def _checks(folder: int) -> list | None:
    """The host checks' rows of the run's folder; None without them (or where they are not JSON)."""
    data = run_files.read_bounded(folder, CHECKS_NAME, MAX_CHECKS_BYTES)
    if data is None:
        return None
    try:
        rows = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if isinstance(rows, dict):  # as `mgpu check --json` prints it
        rows = rows.get("hosts")
    return rows if isinstance(rows, list) else None


def _samples(folder: int) -> list[dict]:
    """The run's samples (samples.jsonl): those of its last MAX_SAMPLES_BYTES; none without it."""
    try:
        fd = run_files.open_file(folder, samples.NAME)
    except (FileNotFoundError, run_files.Unreadable):
        return []
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, MAX_SAMPLES_BYTES, max(0, size - MAX_SAMPLES_BYTES))
    except OSError:
        return []
    finally:
        os.close(fd)
    if size > MAX_SAMPLES_BYTES:
        data = data[data.find(b"\n") + 1:]  # the line cut by the start of what is read
    return samples.read(data.decode("utf-8", "replace"))


def _write_in(folder: int, name: str, text: str) -> None:
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        raise


def _stall_folders(folder: int, told: story.Story) -> dict[int, str]:
    """The stalled attempts whose folder is in the run's, a folder and not a link."""
    found = {}
    for stall in told.stalls:
        try:
            st = os.stat(stall.folder, dir_fd=folder, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            found[stall.attempt] = stall.folder
    return found


def trace_path(output: pathlib.Path) -> pathlib.Path:
    name = output.name[:-len(".html")] if output.name.endswith(".html") else output.name
    return output.with_name(name + TRACE_SUFFIX)


def write_report(run: Run, output: pathlib.Path | None) -> tuple[pathlib.Path, pathlib.Path]:
    """The run's page and trace written (to its folder, or to `output` and beside it); their paths.
    UsageError, one line, for a folder or a file that cannot be read or written."""
    shown = console_safe(run.run_id)
    try:
        folder = run_files.open_folder(run.path)
    except (FileNotFoundError, run_files.Unreadable) as e:
        raise UsageError(f"run {shown}: its folder cannot be read: {console_safe(str(e) or 'gone')}") from None
    try:
        told = story.story(run.record, _checks(folder), _samples(folder))
        stalls = _stall_folders(folder, told)
        if output is None:
            links = {task: name for task, name in told.logs}
            text = page.render(told, links, TRACE_NAME, stall_links={n: f"{name}/" for n, name in stalls.items()})
            try:
                _write_in(folder, TRACE_NAME, trace.trace_json(told))
                _write_in(folder, REPORT_NAME, text)
            except OSError as e:
                raise UsageError(f"cannot write the report in {console_safe(str(run.path))}: "
                                 f"{console_safe(e.strerror or str(e))}") from None
            return run.path / REPORT_NAME, run.path / TRACE_NAME
    finally:
        os.close(folder)
    traced = trace_path(output)
    links = {task: (run.path.absolute() / name).as_uri() for task, name in told.logs}
    text = page.render(told, links, traced.name,
                       stall_links={n: (run.path.absolute() / name).as_uri() + "/" for n, name in stalls.items()})
    for path, content in ((traced, trace.trace_json(told)), (output, text)):
        try:
            path.write_text(content, encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot write {console_safe(str(path))}: {console_safe(e.strerror or str(e))}") from None
    return output, traced
