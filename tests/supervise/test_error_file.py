"""The error file (MGPU_ERROR_FILE) and the per-stream tail, with real processes under supervise()."""

import json
import os
import sys
import textwrap

from launcher import error_file
from launcher.errors import TaskFailed
from launcher.plan.planner import TaskPlan
from launching import run_mgpu
from supervisor_helpers import assert_run_gone, make_plans, supervise_plans


def python_plans(run_id: str, program: str, workers: int = 1) -> list[TaskPlan]:
    """Plans that run `program` (dedented) with this Python in every task."""
    plans = make_plans(run_id, [], workers=workers)
    return [p.__class__(**{**p.__dict__, "argv": (sys.executable, "-c", textwrap.dedent(program))}) for p in plans]


def summary(result) -> list[str]:
    assert isinstance(result.error, TaskFailed)
    return str(result.error).splitlines()


def test_each_local_task_gets_an_error_file_path_per_attempt(run_id, tmp_path):
    # Each task says its path, then waits (bounded) until both have said it: the first to fail
    # stops the other, which must not be before it has printed.
    program = f"""
        import os, pathlib, sys, time
        print("error file:", os.environ["MGPU_ERROR_FILE"], flush=True)
        said = pathlib.Path({str(tmp_path)!r}) / ("said-" + os.environ["MGPU_ATTEMPT"])
        said.mkdir(exist_ok=True)
        (said / os.environ["MGPU_TASK_INDEX"]).touch()
        for _ in range(600):
            if len(list(said.iterdir())) == 2:
                break
            time.sleep(0.05)
        sys.exit(3)
    """
    result = supervise_plans(python_plans(run_id, program, workers=2), run_id, tmp_path, max_restarts=1)
    for name in ("worker-0", "worker-1"):
        log = result.log(name.replace("-", ":"))
        for attempt in (0, 1):
            assert f"error file: {result.run_dir / f'{name}.attempt{attempt}.error.json'}" in log
    assert_run_gone(run_id)


def test_the_summary_shows_what_the_error_file_says(run_id, tmp_path):
    # The program writes its error file and leaves without a traceback: only the file says why.
    program = """
        import os
        from launcher import error_file
        def load_shard(index):
            raise FileNotFoundError(f"shard {index} is missing")
        try:
            load_shard(7)
        except Exception as exc:
            error_file.write(exc)
        print("ERROR: something unrelated on stdout", flush=True)
        os._exit(4)
    """
    result = supervise_plans(python_plans(run_id, program), run_id, tmp_path)
    lines = summary(result)
    assert lines[0] == "worker:0 on 127.0.0.1 exited with code 4"
    assert lines[1] == "  FileNotFoundError: shard 7 is missing"
    assert lines[2] == "  at <string>:5 in load_shard"  # no source line to show for `python -c`
    assert lines[3] == f"log: {result.run_dir / 'worker-0.log'}"
    written = json.loads((result.run_dir / "worker-0.attempt0.error.json").read_text())
    assert written["exception"] == "FileNotFoundError" and written["exit"] == "exception"
    assert 'line 5, in load_shard' in written["traceback"]
    assert_run_gone(run_id)


def test_the_record_decorator_writes_the_error_file(run_id, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        from launcher.error_file import record

        def step(n):
            return 1 / (n - n)

        @record
        def main():
            step(3)

        main()
    """))
    plans = make_plans(run_id, [], workers=1)  # one task: no peer can stop it before it writes
    plans = [p.__class__(**{**p.__dict__, "argv": (sys.executable, str(script))}) for p in plans]
    result = supervise_plans(plans, run_id, tmp_path)
    lines = summary(result)
    assert lines[1:3] == ["  ZeroDivisionError: division by zero", f"  at {script}:5 in step: return 1 / (n - n)"]
    error = error_file.read("worker-0.attempt0.error.json", os.open(result.run_dir, os.O_RDONLY))
    assert error is not None and error.exception == "ZeroDivisionError" and error.frame.startswith(f"{script}:5 ")
    assert_run_gone(run_id)


def test_a_bad_error_file_is_ignored_and_the_output_read_instead(run_id, tmp_path):
    # Not JSON, too big, and a link: each time the summary falls back to the task's traceback.
    for bad in ("'not json'", "'{\"version\": 1, \"exception\": \"X\", \"message\": \"' + 'x' * 70000 + '\"}'", None):
        rid = f"{run_id}-{'link' if bad is None else len(bad)}"
        write = (f"open(os.environ['MGPU_ERROR_FILE'], 'w').write({bad})" if bad is not None
                 else "os.symlink('/etc/hostname', os.environ['MGPU_ERROR_FILE'])")
        program = f"""
            import os
            {write}
            raise KeyError("from the traceback")
        """
        result = supervise_plans(python_plans(rid, program), rid, tmp_path)
        assert summary(result)[1] == "  KeyError: 'from the traceback'"
        assert_run_gone(rid)


def test_the_cause_is_the_exception_however_stdout_lines_interleave(run_id, tmp_path):
    # A thread prints to stdout without pause while the main thread's traceback goes to stderr a
    # line at a time, with stdout lines written between its lines: the launcher reads the two
    # streams on two threads, so its tail has stdout lines amid the traceback.
    program = """
        import sys, threading, traceback
        failing, done = threading.Event(), threading.Event()
        def chatter():  # while the traceback is written, and a bounded number of lines (the tail keeps 500)
            failing.wait()
            for epoch in range(150):
                if done.is_set():
                    break
                print(f"Epoch: {epoch}, accuracy: 0.72", flush=True)
        thread = threading.Thread(target=chatter)
        thread.start()
        def hook(kind, value, tb):
            failing.set()
            for line in traceback.format_exception(kind, value, tb):
                for part in line.splitlines(keepends=True):
                    sys.stderr.write(part)
                    sys.stderr.flush()
                    print("Epoch: between, accuracy: 0.72", flush=True)
            done.set()
            thread.join()
        sys.excepthook = hook
        def deeper(n):
            if n == 0:
                raise RuntimeError("loss is nan")
            deeper(n - 1)
        deeper(12)
    """
    # How the two reading threads take turns is the scheduler's: each run is checked, until one has
    # shown the interleaving (a busy machine can take several).
    interleaved = 0
    for i in range(40):
        if interleaved:
            break
        rid = f"{run_id}-{i}"
        result = supervise_plans(python_plans(rid, program), rid, tmp_path)
        lines = summary(result)
        assert lines[1] == "  RuntimeError: loss is nan", lines
        assert lines[2].startswith("  at <string>:") and "in deeper" in lines[2]
        log = result.log("worker:0").splitlines()
        start = log.index("Traceback (most recent call last):")
        end = log.index("RuntimeError: loss is nan")
        interleaved += any(line.startswith("Epoch") for line in log[start:end])
        assert_run_gone(rid)
    assert interleaved > 0  # the test saw what it is about


def test_only_a_valid_error_document_is_read():
    try:
        raise ValueError("shard 7 is missing\nsecond line")
    except ValueError as exc:
        doc = error_file.document(exc)
    good = error_file.parse(json.dumps(doc).encode())
    assert good is not None and good.headline == "ValueError: shard 7 is missing"
    assert good.frame.startswith(f"{__file__}:")
    assert good.frame.endswith('raise ValueError("shard 7 is missing\\nsecond line")')
    assert error_file.parse(json.dumps({**doc, "exit": "error"}).encode()).headline == "shard 7 is missing"
    for bad in ({**doc, "version": 2}, {**doc, "exit": "crashed"}, {**doc, "message": 7}, {**doc, "frame": ["x"]},
                {**doc, "timestamp": "2026-11-23T12:00:00"}, {**doc, "timestamp": "yesterday"},
                {k: v for k, v in doc.items() if k != "exception"}, [doc]):
        assert error_file.parse(json.dumps(bad).encode()) is None, bad
    assert error_file.parse(b"\xff\xfe") is None
    assert error_file.parse(json.dumps(doc).encode() + b" " * error_file.MAX_BYTES) is None


def test_torchs_error_document_is_read_too():
    """torch's `@record` writes its own format to TORCHELASTIC_ERROR_FILE, the same path."""
    callstack = ('Traceback (most recent call last):\n  File "/job/train.py", line 9, in main\n    load(7)\n'
                 '  File "/job/train.py", line 4, in load\n    raise OSError("shard 7")\nOSError: shard 7\n')
    doc = {"message": {"message": "OSError: shard 7", "extraInfo": {"py_callstack": callstack,
                                                                    "timestamp": "1700000000"}}}
    error = error_file.parse(json.dumps(doc).encode())
    assert error is not None and error.headline == "OSError: shard 7"
    assert error.frame == '/job/train.py:4 in load: raise OSError("shard 7")' and error.traceback == callstack
    assert error.timestamp.year == 2023
    assert error_file.parse(json.dumps({"message": "plain words"}).encode()).headline == "Error: plain words"
    for bad in ({"message": 7}, {"message": {"extraInfo": {}}}):
        assert error_file.parse(json.dumps(bad).encode()) is None, bad


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("MGPU_ERROR_FILE", raising=False)
    assert not error_file.write(RuntimeError("x"))
    target = tmp_path / "error.json"
    monkeypatch.setenv("MGPU_ERROR_FILE", str(target))
    assert error_file.write(RuntimeError("x"))
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]  # written under another name, then renamed
    # A reader that had the file open keeps what it opened: the new one took its name whole.
    with open(target, "rb") as before:
        assert error_file.write(ValueError("y"))
        assert b"RuntimeError" in before.read()
        assert os.fstat(before.fileno()).st_ino != os.stat(target).st_ino
    assert b"ValueError" in target.read_bytes()
    monkeypatch.setenv("MGPU_ERROR_FILE", str(tmp_path / "missing-folder" / "error.json"))
    assert not error_file.write(RuntimeError("x"))  # never raises


def test_the_error_file_path_holds_in_the_tasks_own_workdir(run_id, tmp_path, monkeypatch):
    # A relative --log-dir, and a task that runs in another folder.
    from launcher.backends.local import LocalBackend
    from launcher.supervise.supervisor import SuperviseOptions, supervise

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    program = """
        from launcher.error_file import record
        @record
        def main():
            raise LookupError("written from elsewhere")
        main()
    """
    plans = [p.__class__(**{**p.__dict__, "workdir": str(elsewhere)}) for p in python_plans(run_id, program)]
    runner = LocalBackend()
    with open(tmp_path / "console.txt", "w") as console:
        try:
            supervise(plans, runner, SuperviseOptions(run_id=run_id, log_dir="runs", grace_period=2.0),
                      console)
        except TaskFailed as e:
            failure = str(e)
    assert (tmp_path / "runs" / run_id / "worker-0.attempt0.error.json").is_file()
    assert failure.splitlines()[1] == "  LookupError: written from elsewhere"
    assert_run_gone(run_id)


def test_a_huge_error_still_fits_the_file(tmp_path):
    # Wide characters everywhere: message and traceback are cut so that the launcher reads the file.
    def deep(n):
        if n == 0:
            raise ValueError("\U0001f600" * 100000)
        deep(n - 1)
    try:
        deep(300)
    except ValueError as exc:
        assert error_file.write(exc, path=str(tmp_path / "e.json"))
    data = (tmp_path / "e.json").read_bytes()
    assert len(data) <= error_file.MAX_BYTES
    error = error_file.parse(data)
    assert error is not None and error.exception == "ValueError"
    assert error.frame.endswith('raise ValueError("\\U0001f600" * 100000)')


def launch_writing_error_file(tmp_path, content: bytes, then: str):
    """The real `mgpu launch` of one task that writes `content` to its error file, then runs `then`
    (a line of Python that fails); the launch must fail."""
    program = f"import os, sys\nopen(os.environ['MGPU_ERROR_FILE'], 'wb').write({content!r})\n{then}\n"
    done = run_mgpu("launch", "--local", "1", "--log-dir", str(tmp_path / "runs"), "--", sys.executable, "-c", program,
                    timeout=120)
    assert done.returncode == 1, done.stderr
    return done


def test_what_an_error_file_says_reaches_the_console_escaped(tmp_path):
    """The error file is the task's text like its output: escape sequences in it cannot move the
    cursor, retitle the terminal or forge mgpu's lines on the console (the real `mgpu launch`)."""
    hostile = "shard \x1b]0;owned\x07 \u202eevil missing\x1b[2J\r[mgpu] all tasks succeeded"
    document = {"version": 1, "exception": "Value\x1b[31mError", "message": hostile,
                "frame": "train.py:3 in load: \x1b[1A", "traceback": None, "exit": "exception",
                "timestamp": "2026-11-23T12:00:05.123+00:00"}
    done = launch_writing_error_file(tmp_path, json.dumps(document).encode(), "sys.exit(3)")
    shown = done.stdout + done.stderr
    assert not any(c in shown for c in "\x1b\x07\r\u202e"), shown
    assert "  Value\\x1b[31mError: shard \\x1b]0;owned\\x07 \\u202eevil missing\\x1b[2J" in done.stderr.splitlines()
    assert "  at train.py:3 in load: \\x1b[1A" in done.stderr.splitlines()
    assert not [line for line in shown.splitlines() if line.startswith("[mgpu] all tasks")]


HOSTILE_ERROR_FILES = {
    "nested arrays": b"[" * 60000,
    "nested objects": b'{"version": 1, "x": ' + b'{"a": ' * 20000 + b"1" + b"}" * 20000 + b"}",
    "invalid UTF-8": b"\xff\xfe" * 30000,
    "a huge number": b'{"version": ' + b"1" * 50000 + b"}",
    "too big": b"[" * (error_file.MAX_BYTES + 1),
    "empty": b"",
    "a lone surrogate": b'{"version": 1, "exception": "\\ud800", "message": "\\udfff", "exit": "error", '
                        b'"timestamp": "0001-01-01T00:00:00+14:00"}',
}


def test_any_content_of_an_error_file_parses_or_is_ignored():
    for name, data in HOSTILE_ERROR_FILES.items():
        error = error_file.parse(data)
        assert error is None or isinstance(error, error_file.TaskError), name


def test_a_hostile_error_file_gives_the_normal_summary(tmp_path):
    # The real `mgpu launch`: whatever the task left in its error file, the summary names the
    # task, shows its own traceback's cause and where its log is.
    done = launch_writing_error_file(tmp_path, HOSTILE_ERROR_FILES["nested arrays"],
                                     "raise KeyError('from the traceback')")
    lines = done.stderr.splitlines()
    assert "internal error" not in done.stderr, done.stderr
    assert lines[-4:-1] == ["mgpu: error: worker:0 on 127.0.0.1 exited with code 1", "  KeyError: 'from the traceback'",
                            "  at <string>:3 in <module>"], lines
    assert lines[-1].startswith("log: ") and lines[-1].endswith("/worker-0.log"), lines
