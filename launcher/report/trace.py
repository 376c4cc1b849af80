"""The timeline as Chrome trace events (the JSON object format), which Perfetto and chrome://tracing
open: one track per task, a complete event ("X") per task and attempt from its start to its end,
an instant on the task's track when it was ready, and a global instant for each restart with its
cause. Times are microseconds since the run's start."""

from __future__ import annotations

import json

from launcher.report.story import Story

PROCESS = 1


def _us(seconds: float) -> int:
    return int(round(seconds * 1e6))


def trace(story: Story) -> dict:
    tracks = {name: i + 1 for i, name in enumerate(story.tasks)}
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": PROCESS, "tid": 0,
                           "args": {"name": f"mgpu run {story.run_id}"}}]
    for name, tid in tracks.items():
        events.append({"ph": "M", "name": "thread_name", "pid": PROCESS, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PROCESS, "tid": tid, "args": {"sort_index": tid}})
    for bar in story.bars:
        tid = tracks.get(bar.task)
        if tid is None:
            continue
        end = bar.end if bar.end is not None else max(story.wall, bar.start)
        args = {"host": bar.host, "state": bar.state, "ready_s": bar.ready, "at_fault": bar.at_fault}
        if bar.busy is not None:
            args["busy"] = bar.busy
        if bar.progress:
            args["progress"] = bar.progress
        events.append({"ph": "X", "cat": "attempt", "name": f"attempt {bar.attempt}", "pid": PROCESS, "tid": tid,
                       "ts": _us(bar.start), "dur": max(1, _us(end - bar.start)), "args": args})
        if bar.ready is not None:
            events.append({"ph": "i", "s": "t", "cat": "ready", "name": "ready", "pid": PROCESS, "tid": tid,
                           "ts": _us(bar.ready)})
    for restart in story.restarts:
        if restart.at is None:
            continue
        events.append({"ph": "i", "s": "g", "cat": "restart", "name": f"attempt {restart.attempt} failed: "
                       f"{restart.cause}", "pid": PROCESS, "tid": 0, "ts": _us(restart.at),
                       "args": {"task": restart.task, "host": restart.host, "detail": restart.detail}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_id": story.run_id, "status": story.status, "started_at": story.started_at}}


def trace_json(story: Story) -> str:
    return json.dumps(trace(story), ensure_ascii=True)
