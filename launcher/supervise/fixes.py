"""What mgpu tells a user to do about a failure it recognised, in the words of its command line.

One table, keyed by the kinds supervise/diagnosis.py recognises in a task's output: diagnosis knows
what TensorFlow, PyTorch and JAX print; this module knows mgpu's options and commands. Each fix
stands alone: it names no file that an installed mgpu lacks.
"""

from __future__ import annotations

from typing import Iterable

from launcher.supervise import diagnosis

FIXES: dict[str, str] = {
    diagnosis.KERAS3_FIT_UNDER_MWMS:
        "Keras 3 model.fit does not support MultiWorkerMirroredStrategy (keras-team/keras#20585); "
        "run with --legacy-keras (tf_keras), use Keras 3 on the JAX backend (KERAS_BACKEND=jax; call "
        "keras.distribution.initialize(), which reads the KERAS_DISTRIBUTION_* variables mgpu sets, then "
        "keras.distribution.set_distribution(keras.distribution.DataParallel()) before building the model), "
        "or write a custom training loop",
    diagnosis.KERAS3_NO_RESET_STATES:
        "the program was written for Keras 2 (tf.keras before TensorFlow 2.16): Keras 3's metrics have "
        "reset_state(), not reset_states(); run it with --legacy-keras (tf_keras, Keras 2), or rename the calls "
        "to reset_state()",
    diagnosis.TORCH_ENV_MISSING:
        "PyTorch's env:// rendezvous found no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT: `mgpu launch` sets "
        "them (and LOCAL_RANK, LOCAL_WORLD_SIZE) for the chief and the workers, not the evaluator, which is not "
        "a member of the job; under another scheduler, `eval \"$(mgpu tf-config ... --format torch-env)\"` "
        "exports them",
    diagnosis.JAX_COORDINATOR_MISSING:
        "jax.distributed.initialize() found no coordinator: `mgpu launch` sets JAX_COORDINATOR_ADDRESS (with "
        "JAX_NUM_PROCESSES and JAX_PROCESS_ID) for the chief and the workers, not the evaluator, which is not a "
        "member of the job; under another scheduler, `eval \"$(mgpu tf-config ... --format jax-env)\"` exports them",
    diagnosis.JAX_PROCESSES_MISSING:
        "jax.distributed.initialize() reads only the coordinator from the environment: pass the rest in, "
        "jax.distributed.initialize(num_processes=int(os.environ[\"JAX_NUM_PROCESSES\"]), "
        "process_id=int(os.environ[\"JAX_PROCESS_ID\"])) (mgpu sets both for the chief and the workers)",
    diagnosis.GLOO_CANNOT_CONNECT:
        "PyTorch's Gloo could not connect its peers: it listens on the interface GLOO_SOCKET_IFNAME names, else "
        "on the address the host's own name resolves to (127.0.1.1 on Debian); mgpu sets GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME to the interface holding the address the other hosts dial when its preflight runs "
        "(not with --no-check): `mgpu check` prints them",
    diagnosis.PORT_TAKEN:
        "another process holds the task's port: stop it, or give the task another port "
        "(--port, host:port in --workers, or the spec)",
    diagnosis.HEARTBEATS_STOPPED:
        "a task stopped sending or answering heartbeats: it froze (stopped by SIGSTOP or a debugger, swapping, "
        "starved of CPU), died (killed, out of memory: see `dmesg` on its host) or its host dropped off the "
        "network; it had joined the cluster, so look at that task and its host first",
    diagnosis.PEER_UNREACHABLE:
        "a task could not reach another (it had ended, or the network does not let it through): every host "
        "must resolve and connect to the addresses in TF_CONFIG (firewall, ssh-config alias, DNS); "
        "`mgpu check` tests every pair",
    diagnosis.KERAS3_TORCH_NO_DISTRIBUTION:
        "Keras 3 on the torch backend has no multi-process distribution in this Keras (3.15 and earlier: "
        "keras.distribution.initialize() finds no distribution library for torch); Keras' development branch "
        "adds one, which reads MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and LOCAL_RANK, the variables mgpu "
        "sets: until a Keras release has it, run Keras on the JAX backend (KERAS_BACKEND=jax) or train with "
        "PyTorch's own DistributedDataParallel",
    diagnosis.ABORTED_AT_EXIT:
        "the process aborted in C++ (std::terminate for a thread still running): in PyTorch, typically at exit, "
        "when the process group's threads (Gloo, the TCPStore of rank 0) are torn down while other ranks still "
        "use them; end the program with torch.distributed.barrier() then "
        "torch.distributed.destroy_process_group(), so that every rank leaves together",
    diagnosis.NO_CHECKPOINT_YET:
        "no checkpoint there yet: a program that restores one (an evaluator started with the workers) must "
        "wait for the first checkpoint, e.g. with tf.train.checkpoints_iterator",
}


def hints(lines: Iterable[str]) -> list[str]:
    """One "hint: ..." line per known failure whose wording is in `lines`, in diagnosis's table order."""
    return [f"hint: {FIXES[kind]}" for kind in diagnosis.known_failures(lines)]
