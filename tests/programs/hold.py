"""When a test program's hold is over, for the programs that run until a test lets them go
(torch_ddp.py, jax_psum.py): HOLD is a number of seconds, or a file whose existence ends it."""

import os
import time


def hold_over(hold: str, started: float) -> bool:
    try:
        return time.monotonic() - started >= float(hold)
    except ValueError:
        return os.path.exists(hold)
