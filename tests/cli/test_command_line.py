"""The `mgpu launch` command line as run.json records it (cli/command_line.py): as given, with the
values that carry secrets hidden in every form click takes them, the program's own arguments kept,
and its size bounded. Pure."""

from launcher.cli.command_line import MAX_ARG, MAX_ARGS, recorded


def test_secret_bearing_values_are_hidden_in_both_forms_and_the_rest_is_kept_as_given():
    given = ["launch", "--local", "2", "--env", "TOKEN=hunter2", "--env=KEY=s3cret=x", "--env-file", "secrets.env",
             "--notify", "curl -d @- https://x/?t=tok1", "--notify-url=https://hooks.example/T0/tok2",
             "--setup", "pip install --index-url https://u:tok3@pypi.example/ x", "--health-check=check tok4",
             "--forward-env", "NCCL_*", "--", "python3", "train.py", "--env", "kept"]
    line = recorded(given)
    assert line == ("mgpu", "launch", "--local", "2", "--env", "TOKEN=***", "--env=KEY=***", "--env-file",
                    "secrets.env", "--notify", "***", "--notify-url=***", "--setup", "***", "--health-check=***",
                    "--forward-env", "NCCL_*", "--", "python3", "train.py", "--env", "kept")
    assert not any(secret in " ".join(line) for secret in ("hunter2", "s3cret", "tok1", "tok2", "tok3", "tok4"))


def test_show_secrets_shows_the_env_values_as_the_plans_do_but_never_the_notify_url():
    line = recorded(["launch", "--show-secrets", "--env", "A=1", "--notify-url", "https://hooks/T/tok"], True)
    assert line == ("mgpu", "launch", "--show-secrets", "--env", "A=1", "--notify-url", "***")


def test_an_option_s_value_that_looks_like_an_option_is_still_hidden_and_the_line_is_bounded():
    assert recorded(["launch", "--notify", "--", "x"]) == ("mgpu", "launch", "--notify", "***", "x")
    line = recorded(["launch", *["x" * (MAX_ARG + 10)] * (MAX_ARGS + 10)])
    assert len(line) == MAX_ARGS and line[-1] == "... (13 more arguments)"  # mgpu, launch and 510: 499 kept
    assert max(len(arg) for arg in line) == MAX_ARG
