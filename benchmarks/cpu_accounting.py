"""CPU time per thread of the current process, for benchmarks that split compute from communication.

Linux only: reads /proc/self/task/*/schedstat (nanoseconds on CPU) and the thread names.
"""
import os


def thread_cpu_seconds():
    """{tid: (thread name, CPU seconds so far)} for every live thread of this process."""
    result = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended while we looked
        result[tid] = (name, ns / 1e9)
    return result


def cpu_by_thread_name(before, after):
    """CPU seconds spent between two thread_cpu_seconds() snapshots, summed per thread name."""
    by_name = {}
    for tid, (name, seconds) in after.items():
        spent = seconds - before.get(tid, (name, 0.0))[1]
        if spent > 0:
            by_name[name] = by_name.get(name, 0.0) + spent
    return by_name
