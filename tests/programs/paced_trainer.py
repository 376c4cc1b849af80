"""The built-in trainer (launcher.trainer), every worker pausing 1 s after each checkpoint while
FOLDER/slow exists: a test can act between two checkpoints of a run whose steps are otherwise too
fast to follow, and let it run at full speed by removing the file.

Usage: python paced_trainer.py FOLDER TRAINER-OPTIONS...
"""

import pathlib
import sys
import time

from launcher.trainer import main
from launcher.trainer.checkpoints import Checkpointer

slow = pathlib.Path(sys.argv.pop(1)) / "slow"
save = Checkpointer.save


def paced_save(self: Checkpointer, step: int) -> None:
    save(self, step)
    if slow.exists():
        time.sleep(1.0)


Checkpointer.save = paced_save
sys.exit(main())
