"""diagnosis.py on lines TensorFlow 2.21 really prints (copied from task logs of this machine)."""

from launcher.supervise import fixes
from launcher.supervise import diagnosis

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795433096.679293   23542 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.",
    "I0000 00:00:1795433096.679647   23542 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.",
    "I0000 00:00:1795433096.722927   23542 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, "
    "rebuild TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1795436902.221261   14882 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
    "W1123 12:00:05.123456    1234 preemption_notifier.cc:90] SIGTERM caught at 2026-11-23T11:28:48",
    "E0000 00:00:1795435377.049314    2230 util.cc:131] oneDNN supports DT_HALF only on platforms with AVX-512. "
    "Falling back to the default Eigen-based implementation if present.",
    "2024-01-01 12:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on.",
    "E0000 00:00:1795436902.221261   14882 coordination_service_agent.cc:1] StartAbort UNAVAILABLE: Failed to "
    "send RPC to coordination service. Either the leader task died or the network is down.",
]
CAUSES = [
    "E0000 00:00:1795436902.221261   14882 coordination_service_agent.cc:1] Failed to connect to the leader",
    "ValueError: shard 7 is missing",
    "Traceback (most recent call last):",
]


def test_noise_is_recognised_and_causes_are_kept():
    assert [line for line in NOISE if not diagnosis.is_noise(line)] == []
    assert [line for line in CAUSES if diagnosis.is_noise(line)] == []


def test_the_continuation_of_a_noisy_record_goes_with_it():
    lines = ["I0000 00:00:1795433100.825649   23705 coordination_service.cc:505] Example stragglers:",
             "/job:worker/replica:0/task:1", "loading shard 3"]
    assert diagnosis.meaningful(lines) == ["loading shard 3"]
    assert diagnosis.last_words(NOISE + ["reading the data set"]) == ["reading the data set"]


def test_the_users_frame_is_the_deepest_outside_libraries():
    lines = [
        "Traceback (most recent call last):",
        '  File "/home/me/train.py", line 12, in <module>',
        "    main()",
        '  File "/home/me/train.py", line 9, in main',
        "    model.fit(data)",
        '  File "/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler',
        "    raise e.with_traceback(filtered_tb) from None",
        NOISE[1],
        "ValueError: Attempt to convert a value (PerReplica:{",
        "  0: <tf.Tensor: shape=(8, 4), dtype=float32, numpy=",
    ]
    title, shown = diagnosis.cause(lines)
    assert title == "exception"
    assert shown == ["ValueError: Attempt to convert a value (PerReplica:{", "at /home/me/train.py:9 in main: model.fit(data)"]
    [hint] = fixes.hints(lines)
    assert hint.startswith("hint: Keras 3 model.fit") and "--legacy-keras" in hint


def test_without_a_traceback_the_first_error_line_is_the_cause():
    assert diagnosis.cause(NOISE + ["step 1", CAUSES[0], "step 2"]) == ("first error line", [CAUSES[0]])
    assert diagnosis.cause(NOISE + ["a", "b"], fallback_lines=20) == ("last 2 lines", ["a", "b"])
    assert diagnosis.cause(NOISE + ["bad configuration"]) == ("last line", ["bad configuration"])


# What worker:0 printed when worker:1 was stopped with SIGSTOP in a 2-worker run of the built-in
# trainer (TensorFlow 2.21), in order.
HEARTBEAT_REPORT = [
    "MGPU_PROGRESS 950/100000",
    "E0000 00:00:1795466224.314303   24090 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort "
    "UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending "
    "heartbeats):",
    "/job:worker/replica:0/task:1",
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, "
    "eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError='\\\"\\n\\n\\x06worker\\x10\\x01']",
    "E0000 00:00:1795466224.315137   24100 ring_alg.cc:291] Aborting RingGather with CANCELLED: CANCELLED",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
    "/tensorflow.WorkerService/RecvBuf:",
    ':UNKNOWN:Error received from peer  {grpc_status:1, grpc_message:"CANCELLED"} '
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    "mgpu train: error: worker:0: TensorFlow UnavailableError: Graph execution error:",
]


def test_the_tasks_reported_unhealthy_are_named_as_mgpu_names_them():
    assert diagnosis.unhealthy_tasks(HEARTBEAT_REPORT) == ["worker:1"]
    several = ["E0000 00:00:1.2  1 x.cc:1] UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):",
               "/job:chief/replica:0/task:0", "/job:worker/replica:0/task:3", "/job:worker/replica:0/task:3",
               "The tasks have crashed."]
    assert diagnosis.unhealthy_tasks(several) == ["chief:0", "worker:3"]
    older = ["Task /job:worker/replica:0/task:2 heartbeat timeout. This indicates that the remote task has failed"]
    assert diagnosis.unhealthy_tasks(older) == ["worker:2"]
    # A straggler report lists task names the same way: they are not unhealthy.
    stragglers = ["I0000 00:00:1795433100.825649   23705 coordination_service.cc:505] Example stragglers:",
                  "/job:worker/replica:0/task:1"]
    assert diagnosis.unhealthy_tasks(stragglers + CAUSES) == []


def test_a_heartbeat_report_gets_the_frozen_peer_hint_not_the_network_one():
    [hint] = fixes.hints(HEARTBEAT_REPORT)
    assert hint.startswith("hint: a task stopped sending or answering heartbeats") and "SIGSTOP" in hint
    assert "firewall" not in hint and "DNS" not in hint
    # The network hint still answers the wording of a peer that cannot be reached.
    [hint] = fixes.hints(["E0000 00:00:1.2 1 c.cc:1] Failed to send RegisterTask: UNAVAILABLE: failed to connect "
                              "to all addresses; last error: UNKNOWN: ipv4:10.0.0.2:2222: Connection refused"])
    assert hint.startswith("hint: a task could not reach another")


def end(name, failed=False, at=None):
    return diagnosis.TaskEnd(name, failed, at)


def test_blame_goes_to_the_unhealthy_task_then_a_peer_that_failed_first_then_the_reporter():
    reporter = end("worker:0", True, 100.0)
    peers = [end("worker:1"), end("worker:2", True, 99.0)]
    assert diagnosis.blame(reporter, HEARTBEAT_REPORT, peers) == diagnosis.Blame("worker:1", diagnosis.UNHEALTHY)
    assert diagnosis.blame(reporter, CAUSES, peers) == diagnosis.Blame("worker:2", diagnosis.FAILED_FIRST)
    # Not first: a peer that failed at the same time or later, or that did not fail by itself.
    for later in (end("worker:2", True, 100.0), end("worker:2", True, 101.0), end("worker:2", False, 99.0)):
        assert diagnosis.blame(reporter, CAUSES, [later]) == diagnosis.Blame("worker:0", diagnosis.REPORTER)
    # The earliest of several.
    peers = [end("worker:1", True, 99.5), end("worker:2", True, 98.0), end("worker:3", True, 99.0)]
    assert diagnosis.blame(reporter, CAUSES, peers).task == "worker:2"


def test_blame_ignores_unhealthy_names_that_are_not_peers():
    # The reporter itself, or a task that is not in this run (another job's names), is never blamed so.
    report = HEARTBEAT_REPORT[1:3]
    assert diagnosis.blame(end("worker:1", True, 1.0), report, [end("worker:0")]).task == "worker:1"
    assert diagnosis.blame(end("worker:0", True, 1.0), report, [end("chief:0")]).task == "worker:0"
    several = report + ["/job:worker/replica:0/task:2"]
    verdict = diagnosis.blame(end("worker:0", True, 1.0), several, [end("worker:1"), end("worker:2")])
    assert verdict == diagnosis.Blame("worker:1", diagnosis.UNHEALTHY, ("worker:2",))


TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 40, in <module>',
    "    train()",
    '  File "/home/me/train.py", line 31, in train',
    "    raise RuntimeError(\"loss is nan\")",
    "RuntimeError: loss is nan",
]


def test_a_stdout_line_amid_a_traceback_is_never_the_cause():
    # The reader threads of the two streams append lines in whatever order they get them: a stdout
    # line may land anywhere in the traceback. At every position, the cause is the exception.
    stdout_line = "Epoch: 0, accuracy: 0.72"
    expected = ("exception", ["RuntimeError: loss is nan",
                              'at /home/me/train.py:31 in train: raise RuntimeError("loss is nan")'])
    for position in range(len(TRACEBACK) + 1):
        tail = [diagnosis.TaskLine(line, stderr=True) for line in TRACEBACK]
        tail.insert(position, diagnosis.TaskLine(stdout_line, stderr=False))
        texts = [line.text for line in tail]
        stderr = [line.text for line in tail if line.stderr]
        assert diagnosis.cause(texts, stderr=stderr) == expected, position
    # Two stdout lines at once, between the last frame and the exception line (what was seen).
    texts = TRACEBACK[:-1] + [stdout_line, "Epoch: 1, accuracy: 0.80", TRACEBACK[-1]]
    assert diagnosis.cause(texts, stderr=TRACEBACK) == expected
    # Without the streams told apart, that stdout line was taken for the exception.
    assert diagnosis.cause(texts)[1][0] == stdout_line


def test_a_traceback_on_stdout_is_still_found_when_stderr_has_none():
    # A program whose stderr goes to its stdout (2>&1 in a wrapper script).
    assert diagnosis.cause(["step 1"] + TRACEBACK, stderr=[])[1][0] == "RuntimeError: loss is nan"


def test_a_frame_without_its_source_line_does_not_hide_the_exception():
    # `python -c` and programs run from bytecode alone print no source line under a frame.
    lines = ["Traceback (most recent call last):", '  File "<string>", line 4, in <module>', "KeyError: 'shard'"]
    assert diagnosis.cause(lines) == ("exception", ["KeyError: 'shard'", "at <string>:4 in <module>"])


# What worker:1 printed when worker:0, which runs the coordination service, was stopped with SIGSTOP.
LEADER_SILENT_REPORT = [
    "E0000 00:00:1795467571.761572   22279 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort "
    "DEADLINE_EXCEEDED: Deadline Exceeded",
    "",
    "RPC: /tensorflow.CoordinationService/Heartbeat",
    "E0000 00:00:1795467571.761655   22279 ring_alg.cc:291] Aborting RingReduce with DEADLINE_EXCEEDED: Collective "
    "ops is aborted by: Deadline Exceeded",
    "",
    "RPC: /tensorflow.CoordinationService/Heartbeat",
    "The error could be from a previous operation. Restart your program to reset. "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    "mgpu train: error: worker:1: TensorFlow DeadlineExceededError: Collective ops is aborted by: Deadline Exceeded",
]


def test_unanswered_heartbeats_blame_the_task_that_runs_the_coordination_service():
    reporter = end("worker:1", True, 100.0)
    running = diagnosis.TaskEnd("worker:0", False, None, running=True)
    assert diagnosis.blame(reporter, LEADER_SILENT_REPORT, [running, end("worker:2")]) == \
        diagnosis.Blame("worker:0", diagnosis.LEADER_SILENT)
    # With a chief, the chief runs it.
    chief = diagnosis.TaskEnd("chief:0", False, None, running=True)
    assert diagnosis.blame(reporter, LEADER_SILENT_REPORT, [chief, running]).task == "chief:0"
    # Not a leader that had already ended by itself (it left early: the reporter's failure is its own),
    # nor when the reporter is the leader.
    assert diagnosis.blame(reporter, LEADER_SILENT_REPORT, [end("worker:0", False, 90.0)]).task == "worker:1"
    assert diagnosis.blame(end("worker:0", True, 1.0), LEADER_SILENT_REPORT, [end("worker:1")]).task == "worker:0"
    [hint] = fixes.hints(LEADER_SILENT_REPORT)
    assert hint.startswith("hint: a task stopped sending or answering heartbeats")


def test_a_coordination_service_that_is_gone_is_not_taken_for_a_silent_one():
    # What worker:1 printed when worker:0, which runs the service, had already exited.
    gone = ["tensorflow.python.framework.errors_impl.UnavailableError: {{function_node __wrapped__CollectiveReduceV2}} "
            "Collective ops is aborted by: Failed to send RPC to coordination service.",
            "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
            "/tensorflow.CoordinationService/Heartbeat:",
            ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all addresses; '
            'last error: UNKNOWN: ipv4:127.0.0.1:42399: Failed to connect to remote host: Connection refused"}']
    assert not diagnosis.leader_unanswered(gone)
    [hint] = fixes.hints(gone)
    assert hint.startswith("hint: a task could not reach another")


def test_every_known_failure_has_one_fix_and_every_fix_a_failure():
    kinds = [known.kind for known in diagnosis.KNOWN_FAILURES]
    assert len(kinds) == len(set(kinds)) and set(kinds) == set(fixes.FIXES)


def test_fixes_name_no_file_an_installed_mgpu_lacks():
    for fix in fixes.FIXES.values():
        assert "examples/" not in fix and "cluster_specs" not in fix and ".py" not in fix, fix


def test_gloo_that_cannot_connect_its_peers_points_at_the_interface():
    """What torch 2.13's Gloo prints when a peer listens on loopback (seen on two hosts)."""
    line = ("RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/"
            "tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:6062")
    [hint] = fixes.hints(["Traceback (most recent call last):", line])
    assert "GLOO_SOCKET_IFNAME" in hint and "mgpu check" in hint


KERAS_ON_TORCH = [  # Keras 3.15 with KERAS_BACKEND=torch, keras.distribution.initialize()
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/keras/src/distribution/distribution_lib.py", line 151, in initialize',
    "    distribution_lib.initialize(job_addresses, num_processes, process_id)",
    "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    "AttributeError: 'NoneType' object has no attribute 'initialize'",
]


def test_keras_on_torch_without_a_distribution_library_gets_its_hint_and_only_it():
    [hint] = fixes.hints(KERAS_ON_TORCH)
    assert "torch backend" in hint and "KERAS_BACKEND=jax" in hint and "MASTER_ADDR" in hint
    # The same AttributeError from another program's code is not Keras' missing library.
    assert fixes.hints(["Traceback (most recent call last):", "    client.initialize()", KERAS_ON_TORCH[-1]]) == []


def test_an_abort_at_exit_points_at_the_process_group():
    [hint] = fixes.hints(["rank 1: done", "terminate called without an active exception"])
    assert "destroy_process_group()" in hint and "barrier()" in hint
