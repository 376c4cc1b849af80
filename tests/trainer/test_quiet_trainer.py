"""The built-in trainer under `mgpu launch`: TensorFlow's C++ INFO and WARNING records hidden unless
--tf-log-level asks for them, no coordination-service errors on success, and mgpu's closing line."""


import pytest
from needs import installed_version

from launching import run_mgpu
from launcher.supervise import diagnosis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
installed_version("tensorflow", "the train extra")

UNCLEAN_EXIT = ("CoordinationService", "have crashed", "Heartbeat")
# A record TensorFlow's gRPC server logs at INFO level once it listens (after the start-up banner).
SERVER_STARTED = "Started server with target"
ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
TRAINER = ["--model", "small", "--dataset", "synthetic", "--threads", "1", "--train-steps", "4", "--log-every", "2"]


def launch(tmp_path, run_id, *trainer_args, launcher_args=()):
    done = run_mgpu("launch", "--local", "2", "--threads-per-task", "1", "--log-dir", str(tmp_path / "runs"),
                    "--run-id", run_id, *launcher_args, "--", *TRAINER, *trainer_args, cwd=tmp_path, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = [(tmp_path / "runs" / run_id / f"worker-{i}.log").read_text() for i in (0, 1)]
    return done, logs


def test_quiet_by_default_and_clean_at_the_end(tmp_path):
    done, logs = launch(tmp_path, "quiet")
    for log in logs:
        assert SERVER_STARTED not in log
        assert not [word for word in UNCLEAN_EXIT if word in log], log[-3000:]
    assert not [word for word in UNCLEAN_EXIT if word in done.stdout + done.stderr]
    # TensorFlow prints its start-up notices whatever TF_CPP_MIN_LOG_LEVEL says: the logs have
    # them, the console does not, nor any INFO/WARNING record later.
    assert all(ABSL_PREAMBLE in log for log in logs)
    chatter = [line for line in done.stdout.splitlines()
               if diagnosis.is_noise(line.split("] ", 1)[-1]) and line.split("] ", 1)[-1].strip()]
    assert chatter == [], chatter
    assert "[mgpu] all 2 tasks ready" in done.stdout
    closing = done.stdout.splitlines()[-1]
    assert closing.startswith("[mgpu] done: 2 tasks succeeded in ") and closing.endswith("/runs/quiet/")


def test_tf_log_level_zero_and_show_tf_logs_show_the_info_records(tmp_path):
    done, logs = launch(tmp_path, "verbose", "--tf-log-level", "0", launcher_args=["--show-tf-logs"])
    assert all(SERVER_STARTED in log for log in logs)
    for name in ("worker:0", "worker:1"):
        assert f"[{name}] {ABSL_PREAMBLE}" in done.stdout + done.stderr
        assert any(line.startswith(f"[{name}] I") and SERVER_STARTED in line for line in done.stdout.splitlines())
