"""A task that redraws one line N times with carriage returns, like a Keras progress bar, then ends it."""

import sys
import time

count = int(sys.argv[1])
for i in range(1, count + 1):
    sys.stdout.write(f"\rprogress {i}/{count}")
    sys.stdout.flush()
    time.sleep(0.002)
sys.stdout.write("\n")
print("done", flush=True)
