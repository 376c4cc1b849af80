"""The soak of the built-in trainer (benchmarks/soak.py --program trainer): the same hosts and faults,
the program `mgpu launch`'s own TensorFlow trainer (MultiWorkerMirroredStrategy, the small model on
synthetic data, a checkpoint every CHECKPOINT_EVERY steps in a model dir on the hosts' shared disk,
from which a restart resumes).

The trainer writes no progress file of its own: the soak reads the run's progress where mgpu
records it, the last line of the run folder's samples.jsonl (written every 2 s: the attempt, each
task's last step, when it was seen), so a first new step is known to within that period. Equal
weights: the chief's metrics.json, whose replica_fingerprints are every replica's checksum of its
weights at the end."""

from __future__ import annotations

import json

import soak

CHECKPOINT_EVERY = 20
SAMPLES_TAIL_BYTES = 64 * 1024  # the last lines of samples.jsonl, enough for one


class TrainerSoak(soak.Soak):
    def launch_argv(self, workers: list[str], spares: list[str]) -> list[str]:
        argv = super().launch_argv(workers, spares)
        trainer = ["--dataset", "synthetic", "--model", "small", "--train-steps", str(self.args.steps),
                   "--batch-size-per-replica", "16", "--log-every", "50", "--checkpoint-every", str(CHECKPOINT_EVERY),
                   "--model-dir", str(self.folder / "model")]
        return argv[:argv.index("--")] + ["--python", soak.PYTHON, "--threads-per-task", "1", "--"] + trainer

    def progress(self) -> tuple[int, int, float] | None:
        """(attempt, the last step any task reached, when it was seen) from the run's samples."""
        try:
            with open(self.run_json.parent / "samples.jsonl", "rb") as samples:
                samples.seek(0, 2)
                samples.seek(max(0, samples.tell() - SAMPLES_TAIL_BYTES))
                last = samples.read().splitlines()[-1]
            sample = json.loads(last)
            steps = [step for step in sample["steps"].values() if isinstance(step, int)]
            return (int(sample["attempt"]), max(steps), float(sample["at"])) if steps else None
        except (OSError, ValueError, IndexError, KeyError, TypeError, AttributeError):
            return None

    def run(self) -> dict:
        result = super().run()
        try:
            fingerprints = json.loads((self.folder / "model" / "metrics.json").read_text())["replica_fingerprints"]
        except (OSError, ValueError, KeyError, TypeError):
            fingerprints = []
        result["program"] = "trainer"
        result["equal_weights"] = len(fingerprints) == self.args.workers and len(set(fingerprints)) == 1
        return result
