"""What --sync takes from a folder (read at intake), and the folders it refuses: one line, exit 2,
nothing started."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

import launching
from launcher.config.sync import folder_digest
from launcher.errors import UsageError
from launcher.intake.sync_folder import read_synced_folder


def paths(folder) -> list[str]:
    return [f.path for f in folder.files]


def test_in_a_git_work_tree_the_files_git_would_commit_minus_mgpuignore(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    (tmp_path / ".gitignore").write_text("*.ckpt\n")
    (tmp_path / ".mgpuignore").write_text("notes/\n")
    for name in ("train.py", "model.ckpt", "untracked.py", "notes/todo.txt", "pkg/util.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py", "pkg/util.py", ".gitignore"], check=True)
    assert paths(read_synced_folder(str(tmp_path), 1 << 20)) == [
        ".gitignore", ".mgpuignore", "pkg/util.py", "train.py", "untracked.py"]


def test_elsewhere_every_file_with_modes_links_and_one_digest(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "sub" / "run.sh").chmod(0o755)
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "to-a").symlink_to("a.txt")
    folder = read_synced_folder(str(tmp_path), 1 << 20)
    assert [(f.path, f.mode, f.size, f.link) for f in folder.files] == [
        ("a.txt", stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode), 1, None), ("sub/run.sh", 0o755, 10, None), ("to-a", 0, 0, "a.txt")]
    assert folder.total_bytes == 11 and folder.digest == folder_digest(folder.files)
    (tmp_path / "a.txt").write_text("b")
    assert read_synced_folder(str(tmp_path), 1 << 20).digest != folder.digest
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub" / "run.sh").chmod(0o700)
    assert read_synced_folder(str(tmp_path), 1 << 20).digest != folder.digest
    (tmp_path / "sub" / "run.sh").chmod(0o755)
    assert read_synced_folder(str(tmp_path), 1 << 20).digest == folder.digest


def test_a_link_leaving_the_folder_is_refused_naming_it(tmp_path):
    (tmp_path / "data").symlink_to("/etc")
    with pytest.raises(UsageError, match="data is a symbolic link to /etc, outside the folder"):
        read_synced_folder(str(tmp_path), 1 << 20)


def dry_run(folder, *args: str, env: dict | None = None, prefix: tuple[str, ...] = ()):
    command = [*prefix, *launching.MGPU, "launch", "--workers", "h1:2222", "--sync", str(folder), *args,
               "--dry-run", "--", "python3", "train.py"]
    return subprocess.run(command, env=env or launching.mgpu_env(), capture_output=True, text=True, timeout=60)


def one_line_exit_2(done: subprocess.CompletedProcess, expected: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert expected in done.stderr, done.stderr


def test_a_link_out_of_the_folder_a_folder_over_the_cap_and_an_unreadable_file_are_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "secrets").symlink_to("/etc/passwd")
    one_line_exit_2(dry_run(out), f"mgpu: error: --sync {out}: secrets is a symbolic link to /etc/passwd, "
                                  f"outside the folder")
    big = tmp_path / "big"
    big.mkdir()
    (big / "weights.bin").write_bytes(b"\0" * 3000)
    one_line_exit_2(dry_run(big, "--sync-max-size", "2K"),
                    f"mgpu: error: --sync {big}: more than 2.0 KB to copy (at weights.bin)")
    assert dry_run(big, "--sync-max-size", "3K").returncode == 0
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "key.pem").write_text("x")
    (locked / "key.pem").chmod(0)
    # Root reads any file: without its DAC capabilities it cannot (setpriv drops them).
    prefix = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search") if os.geteuid() == 0 else ()
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to read as root without reading everything")
    one_line_exit_2(dry_run(locked, prefix=prefix), f"mgpu: error: --sync {locked}: cannot read key.pem: "
                                                    f"Permission denied")


def test_the_dry_run_says_what_is_synced_where_and_set_up(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print(1)\n")
    done = subprocess.run([*launching.MGPU, "launch", "--workers", "h1:2222,h2:2222", "--sync", str(tmp_path / "proj"),
                           "--setup", "pip install -r requirements.txt", "--dry-run", "--", "python3", "train.py"],
                          env=launching.mgpu_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith(f"Sync: {tmp_path / 'proj'}: 1 file(s), 9 B, digest ")
    assert lines[3:8] == ["  to:        h1:mgpu-sync/proj, h2:mgpu-sync/proj",
                          "  files:     train.py",
                          "Setup: pip install -r requirements.txt",
                          "  on:        h1, h2, once each, in the workdir, before the tasks (timeout 1800 s)",
                          ""]
    assert "  workdir:   mgpu-sync/proj" in lines
