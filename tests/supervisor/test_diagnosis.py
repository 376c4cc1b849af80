"""diagnosis.py on lines TensorFlow 2.21 really prints (copied from task logs of this machine)."""

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
    [hint] = diagnosis.hints(lines)
    assert hint.startswith("hint: Keras 3 model.fit") and "--legacy-keras" in hint


def test_without_a_traceback_the_first_error_line_is_the_cause():
    assert diagnosis.cause(NOISE + ["step 1", CAUSES[0], "step 2"]) == ("first error line", [CAUSES[0]])
    assert diagnosis.cause(NOISE + ["a", "b"], fallback_lines=20) == ("last 2 lines", ["a", "b"])
