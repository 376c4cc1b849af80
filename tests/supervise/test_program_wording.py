"""diagnosis.py and fixes.py on what published programs print under `mgpu launch` (lines copied
from the logs of real runs on this machine): PyTorch's rank prefixes, Keras 3 running code written
for Keras 2, TensorFlow's multi-line INFO records."""

from launcher.supervise import diagnosis, fixes

# worker-1.log of tests/programs/torch_resume.py (torch 2.13, gloo, 2 local tasks) given a file
# that is no checkpoint: the excepthook torch.distributed installs puts "[rank1]: " before each line.
TORCH_RESUME = [
    "=> loading checkpoint '/tmp/bad.pth.tar'",
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/home/me/examples/imagenet/main.py", line 24, in <module>',
    "[rank1]:     main_worker(sys.argv[1])",
    '[rank1]:   File "/home/me/examples/imagenet/main.py", line 19, in main_worker',
    '[rank1]:     checkpoint = torch.load(resume, map_location="cpu")',
    "[rank1]:                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    '[rank1]:   File "/venv/lib/python3.11/site-packages/torch/serialization.py", line 1633, in load',
    "[rank1]:     raise pickle.UnpicklingError(_get_wo_message(str(e))) from None",
    "[rank1]: _pickle.UnpicklingError: Weights only load failed.",
    "[rank1]: Please file an issue with the following so that we can make `weights_only=True` compatible "
    "with your use case: WeightsUnpickler error: ",
    "",
    "[rank1]: Unsupported operand 110",
]
RESUME_CAUSE = ("exception", ["_pickle.UnpicklingError: Weights only load failed.",
                              'at /home/me/examples/imagenet/main.py:19 in main_worker: '
                              'checkpoint = torch.load(resume, map_location="cpu")'])


def test_pytorch_rank_prefixes_are_read_through():
    assert diagnosis.cause(TORCH_RESUME) == RESUME_CAUSE
    # From stderr, with the stdout line apart (as the supervisor hands them over).
    assert diagnosis.cause(TORCH_RESUME, stderr=TORCH_RESUME[1:]) == RESUME_CAUSE


def test_a_rank_prefixed_traceback_amid_another_ranks_lines():
    # A Hugging Face Trainer's missing folder, on rank 3 of a larger job, a stdout line inside it.
    lines = ["[rank3]: Traceback (most recent call last):",
             '[rank3]:   File "/home/me/run_glue.py", line 88, in <module>',
             "[rank3]:     trainer.train(resume_from_checkpoint=args.resume)",
             "{'loss': 0.6931, 'epoch': 0.1}",
             "[rank3]: ValueError: Can't find a valid checkpoint at out/checkpoint-500"]
    assert diagnosis.cause(lines, stderr=[lines[i] for i in (0, 1, 2, 4)]) == (
        "exception", ["ValueError: Can't find a valid checkpoint at out/checkpoint-500",
                      "at /home/me/run_glue.py:88 in <module>: trainer.train(resume_from_checkpoint=args.resume)"])
    # Without a traceback, the first error line is shown without the prefix too.
    assert diagnosis.cause(["step 3", "[rank0]: RuntimeError: shapes do not match"]) == \
        ("first error line", ["RuntimeError: shapes do not match"])


def test_only_torchs_own_prefix_is_taken_off():
    assert diagnosis.without_rank_prefix("[rank12]: x") == "x"
    for line in ("[rank1] x", "[ranked]: x", " [rank1]: x", "[rank1]:x", "x [rank1]: y"):
        assert diagnosis.without_rank_prefix(line) == line


def test_known_failures_are_recognised_through_the_prefix():
    [hint] = fixes.hints(["[rank1]: Traceback (most recent call last):",
                          "[rank1]: RuntimeError: Gloo connectFullMesh failed with [pair.cc:152] timed out connecting"])
    assert "GLOO_SOCKET_IFNAME" in hint
    # A wording known only at the start of a line: Keras 3 on torch, in a program that had joined
    # its process group itself before keras.distribution.initialize().
    [hint] = fixes.hints([
        '[rank0]:   File "/venv/lib/python3.11/site-packages/keras/src/distribution/distribution_lib.py", '
        'line 151, in initialize',
        "[rank0]:     distribution_lib.initialize(job_addresses, num_processes, process_id)",
        "[rank0]: AttributeError: 'NoneType' object has no attribute 'initialize'"])
    assert "torch backend" in hint


def test_keras2s_reset_states_under_keras3_points_to_legacy_keras():
    # TensorFlow's custom-training tutorial, run with Keras 3 (tests/programs/keras2_metrics_loop.py).
    line = "AttributeError: 'SparseCategoricalAccuracy' object has no attribute 'reset_states'. Did you mean: 'reset_state'?"
    [hint] = fixes.hints(["Traceback (most recent call last):", "    train_accuracy.reset_states()", line])
    assert "--legacy-keras" in hint and "reset_state()" in hint
    assert fixes.hints(["AttributeError: 'Trainer' object has no attribute 'reset_state'"]) == []


# What every worker and parameter server of TensorFlow's parameter-server tutorial printed on stderr
# (TF 2.21, tests/programs/tf_parameter_server.py): one INFO record of 21 lines, its ConfigProto
# after protobuf's marker of a debug string (drawn from three; this task drew /debugonly), then a
# blank line.
SESSION_OPTIONS = [
    "I0000 00:00:1795877465.136418   16224 eager_service_impl.cc:349] Creating sync eager service context "
    "with rendezvous_id on host vm /job:ps/replica:0/task:0",
    "I0000 00:00:1795877465.136475   16224 eager_service_impl.cc:355] SessionOptions: goo.gle/debugonly  ",
    "device_count {", '  key: "CPU"', "  value: 1", "}",
    "device_count {", '  key: "GPU"', "  value: 0", "}",
    "gpu_options {", "  experimental {", "  }", "}",
    "allow_soft_placement: true",
    "experimental {", '  collective_group_leader: "/job:ps/replica:0/task:0"', "}",
    "pluggable_device_options {", "  experimental {", "  }", "}",
    "",
]


def console_view(lines):
    noise = diagnosis.NoiseFilter(blank_lines_shown=True)
    return [line for line in lines if not noise.is_noise(line)]


def test_a_multi_line_info_record_is_noise_to_its_last_line():
    said = ["ps:0 serving"]
    assert diagnosis.meaningful(said + SESSION_OPTIONS + said) == said + said
    assert console_view(said + SESSION_OPTIONS + said) == said + said
    # The marker's other draws, and older protobuf that opens the first message on the record's line.
    for marker in ("goo.gle/debugstr", "goo.gle/debugproto"):
        assert console_view([SESSION_OPTIONS[1].replace("goo.gle/debugonly", marker)] + SESSION_OPTIONS[2:]) == []
    older = ["2024-01-01 12:00:00.123456: I tensorflow/core/x.cc:355] SessionOptions: device_count {",
             '  key: "CPU"', "  value: 1", "}", "allow_soft_placement: true", ""]
    assert console_view(older + said) == said


def test_a_programs_own_lines_are_never_taken_for_a_records_text():
    record = SESSION_OPTIONS[1]
    # Lines in the text's shape that follow no such record, or follow its end.
    own = ["loss: 0.25", "epoch {", "}", "", "step: 3"]
    assert console_view(own) == own
    assert console_view(SESSION_OPTIONS + own) == own
    # A record's text cut short: the first line that is not of it is the program's, and so is all after.
    assert console_view([record, "device_count {", "Epoch 1/3", "loss: 0.25", ""]) == ["Epoch 1/3", "loss: 0.25", ""]
    assert console_view([record, "}", "loss: 0.25"]) == ["}", "loss: 0.25"]  # a close with nothing open
    # A single-line INFO record that names no text leaves the next lines alone.
    assert console_view([SESSION_OPTIONS[0], "loss: 0.25", "epoch {"]) == ["loss: 0.25", "epoch {"]
