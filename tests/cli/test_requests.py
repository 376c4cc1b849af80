"""The command line's arguments become frozen request objects once; below them nothing takes
click's options or a flag name."""

import dataclasses

import pytest

from launcher.cli.options import hosts_request
from launcher.intake.load import HostNaming, HostsRequest, SlurmScope, TaskSettings, read_spec, with_task_settings
from launcher.config.addresses import parse_worker_list
from launcher.errors import UsageError


def test_requests_are_frozen():
    for request in (HostsRequest(), TaskSettings(), HostNaming()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            request.port = 1  # type: ignore[misc]


def test_a_request_alone_says_what_the_cluster_is():
    request = HostsRequest(workers=tuple(parse_worker_list("h1:2300,h2")), port=2400)
    spec = with_task_settings(read_spec(request), TaskSettings(env_pairs=(("A", "b"),), threads_per_task=2))
    assert [(t.role, t.host, t.port) for t in spec.tasks] == [("worker", "h1", 2300), ("worker", "h2", 2400)]
    assert spec.env == {"A": "b"} and spec.secret_env == {"A"} and spec.threads_per_task == 2


def test_conflicting_sources_are_refused_in_the_words_of_the_flags():
    with pytest.raises(UsageError, match="give only one of --workers and --from-slurm"):
        hosts_request({"workers": parse_worker_list("h1")}, slurm=SlurmScope.STEP)
