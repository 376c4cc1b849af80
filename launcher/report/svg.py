"""The report's pictures as inline SVG: the timeline (a row per task, a bar per attempt), each
task's busy share over the attempts, and the wall time split into good and lost time.

Every text is escaped here (`esc`); the pictures have no script and fetch nothing. A bar's details
are in its <title>, which browsers show on hover.
"""

from __future__ import annotations

import html
import math
from typing import Iterable, Sequence

from launcher.report.story import Bar, Story

WIDTH = 1000
LABEL = 170  # the task names' column
ROW = 24
BAR = 14
TOP = 34  # room for the restarts' labels above the rows
AXIS = 26

# The time lost by cause (lost_time.CATEGORIES), in the wall time's bar.
LOST_COLOURS = {"start_up": "#90a4ae", "redone": "#ef6c00", "after_last_step": "#c62828", "stalled": "#6a1b9a",
                "restart": "#f9a825", "finish": "#b0bec5"}
COLOURS = {"ok": "#2e7d32", "fault": "#c62828", "stopped": "#78909c", "running": "#1565c0"}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    minutes, rest = divmod(int(round(value)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def _step(span: float, ticks: int = 8) -> float:
    """A round tick step that cuts `span` into about `ticks` parts."""
    raw = max(span, 1e-3) / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10, 15, 30, 60):
        if factor * power >= raw:
            return factor * power
    return 10 * power


class _Scale:
    def __init__(self, wall: float):
        self.wall = max(wall, 1e-3)
        self.width = WIDTH - LABEL - 16

    def x(self, t: float) -> float:
        return round(LABEL + min(max(t, 0.0), self.wall) / self.wall * self.width, 2)

    def axis(self, y: float) -> Iterable[str]:
        step = _step(self.wall)
        yield f'<line x1="{LABEL}" y1="{y}" x2="{LABEL + self.width}" y2="{y}" class="axis"/>'
        for i in range(0, int(self.wall / step) + 1):
            x = self.x(i * step)
            yield f'<line x1="{x}" y1="{y}" x2="{x}" y2="{y + 4}" class="axis"/>'
            yield f'<text x="{x}" y="{y + 16}" class="tick">{esc(seconds(i * step))}</text>'


def _kind(bar: Bar) -> str:
    if bar.end is None:
        return "running"
    if bar.at_fault:
        return "fault"
    return "ok" if bar.ok else "stopped"


def _bar_title(bar: Bar) -> str:
    parts = [f"{bar.task}, attempt {bar.attempt} on {bar.host}", f"started +{seconds(bar.start)}",
             f"ready +{seconds(bar.ready)}" if bar.ready is not None else "never ready",
             f"ended +{seconds(bar.end)}: {bar.state}" if bar.end is not None else "running"]
    if bar.at_fault:
        parts.append("the attempt's failure was charged to it")
    if bar.progress:
        parts.append(bar.progress)
    return "; ".join(parts)


def timeline(story: Story) -> str:
    scale = _Scale(story.wall)
    rows = {name: i for i, name in enumerate(story.tasks)}
    height = TOP + ROW * len(rows) + AXIS
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="timeline of the run">']
    for name, i in rows.items():
        y = TOP + i * ROW
        out.append(f'<text x="{LABEL - 8}" y="{y + ROW / 2 + 4}" class="task" text-anchor="end">{esc(name)}</text>')
        out.append(f'<line x1="{LABEL}" y1="{y + ROW}" x2="{WIDTH - 16}" y2="{y + ROW}" class="grid"/>')
    for number, start in story.attempt_starts:
        if number == 0 or start <= 0:
            continue
        x = scale.x(start)
        out.append(f'<line x1="{x}" y1="{TOP - 18}" x2="{x}" y2="{TOP + ROW * len(rows)}" class="restart"/>')
        out.append(f'<text x="{x + 3}" y="{TOP - 8}" class="restart-label">restart {esc(number)}</text>')
    for bar in story.bars:
        if bar.task not in rows:
            continue
        y = TOP + rows[bar.task] * ROW + (ROW - BAR) / 2
        x0 = scale.x(bar.start)
        x1 = max(scale.x(bar.end if bar.end is not None else story.wall), x0 + 2)
        ready = scale.x(bar.ready) if bar.ready is not None else None
        colour = COLOURS[_kind(bar)]
        out.append(f'<g class="bar {_kind(bar)}" data-task="{esc(bar.task)}" data-attempt="{esc(bar.attempt)}">'
                   f'<title>{esc(_bar_title(bar))}</title>')
        split = min(ready, x1) if ready is not None else x1  # the start-up, before the task was ready
        out.append(f'<rect x="{x0}" y="{y}" width="{round(split - x0, 2)}" height="{BAR}" fill="{colour}" '
                   f'fill-opacity="0.4"/>')
        if split < x1:
            out.append(f'<rect x="{split}" y="{y}" width="{round(x1 - split, 2)}" height="{BAR}" fill="{colour}"/>')
        if ready is not None:
            out.append(f'<line x1="{ready}" y1="{y - 2}" x2="{ready}" y2="{y + BAR + 2}" class="ready"/>')
        if x1 - x0 > 28:  # the attempt, and where there is room the host (a spare's shows at a glance)
            label = f"#{bar.attempt} {bar.host}" if x1 - x0 > 40 + 7 * len(bar.host) else f"#{bar.attempt}"
            out.append(f'<text x="{x0 + 4}" y="{y + BAR - 3}" class="in-bar">{esc(label)}</text>')
        out.append("</g>")
    out.extend(scale.axis(TOP + ROW * len(rows) + 2))
    out.append("</svg>")
    return "\n".join(out)


def _heat(share: float) -> str:
    """White for idle, deep orange for a task busy all the time."""
    share = min(max(share, 0.0), 1.0)
    r, g, b = (255 - round(share * (255 - 230)), 255 - round(share * (255 - 81)), 255 - round(share * 255))
    return f"rgb({r},{g},{b})"


def busy(story: Story) -> str:
    """Each task's busy share over the attempts: one cell per attempt, as deep as the share. In a
    synchronous job the task the others wait for is the busiest: the darkest row."""
    scale = _Scale(story.wall)
    rows = {name: i for i, name in enumerate(story.tasks)}
    height = 8 + ROW * len(rows) + AXIS
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="busy" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="busy share of each task">']
    for name, i in rows.items():
        out.append(f'<text x="{LABEL - 8}" y="{8 + i * ROW + ROW / 2 + 4}" class="task" '
                   f'text-anchor="end">{esc(name)}</text>')
    for bar in story.bars:
        if bar.task not in rows or bar.busy is None:
            continue
        y = 8 + rows[bar.task] * ROW + 2
        x0 = scale.x(bar.start)
        x1 = max(scale.x(bar.end if bar.end is not None else story.wall), x0 + 2)
        share = f"{round(100 * min(max(bar.busy, 0.0), 1.0))}%"
        out.append(f'<g class="share" data-task="{esc(bar.task)}"><title>{esc(bar.task)}, attempt '
                   f'{esc(bar.attempt)}: busy {share} of its last window</title>'
                   f'<rect x="{x0}" y="{y}" width="{round(x1 - x0, 2)}" height="{ROW - 4}" '
                   f'fill="{_heat(bar.busy)}" stroke="#bbb"/>')
        if x1 - x0 > 34:
            out.append(f'<text x="{x0 + 4}" y="{y + ROW - 9}" class="in-cell">{share}</text>')
        out.append("</g>")
    out.extend(scale.axis(8 + ROW * len(rows) + 2))
    out.append("</svg>")
    return "\n".join(out)


def busy_over_time(story: Story) -> str:
    """Each task's busy share over the run, from its samples: a row per task, cells as deep as the
    share. In a synchronous job the task the others wait for is the darkest row, all along."""
    scale = _Scale(story.wall)
    rows = {name: i for i, (name, _) in enumerate(story.busy_over_time)}
    height = TOP + ROW * len(rows) + AXIS
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="busy-over-time" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="busy share of each task over time">']
    for number, start in story.attempt_starts:
        if number == 0 or start <= 0:
            continue
        x = scale.x(start)
        out.append(f'<line x1="{x}" y1="{TOP - 18}" x2="{x}" y2="{TOP + ROW * len(rows)}" class="restart"/>')
        out.append(f'<text x="{x + 3}" y="{TOP - 8}" class="restart-label">restart {esc(number)}</text>')
    for name, cells in story.busy_over_time:
        y = TOP + rows[name] * ROW
        mean = (sum((c.end - c.start) * c.share for c in cells) / total
                if (total := sum(c.end - c.start for c in cells)) > 0 else None)
        label = f"{name} {round(100 * mean)}%" if mean is not None else name
        out.append(f'<g class="share-row" data-task="{esc(name)}"><text x="{LABEL - 8}" y="{y + ROW / 2 + 4}" '
                   f'class="task" text-anchor="end">{esc(label)}</text>')
        for cell in cells:
            x0 = scale.x(cell.start)
            x1 = max(scale.x(cell.end), x0 + 1)
            out.append(f'<rect x="{x0}" y="{y + 2}" width="{round(x1 - x0, 2)}" height="{ROW - 4}" '
                       f'fill="{_heat(cell.share)}"><title>{esc(name)} +{esc(seconds(cell.start))} to '
                       f'+{esc(seconds(cell.end))}: busy {round(100 * cell.share)}%</title></rect>')
        out.append("</g>")
    out.extend(scale.axis(TOP + ROW * len(rows) + 2))
    out.append("</svg>")
    return "\n".join(out)


def split(parts: Sequence[tuple[str, float, str]], total: float) -> str:
    """One bar of `total` seconds cut into (name, seconds, colour) parts, left to right."""
    width = WIDTH - LABEL - 16
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="split" width="{WIDTH}" height="30" '
           f'viewBox="0 0 {WIDTH} 30" role="img" aria-label="the wall time, good and lost">',
           f'<text x="{LABEL - 8}" y="19" class="task" text-anchor="end">wall {esc(seconds(total))}</text>']
    x = float(LABEL)
    for name, value, colour in parts:
        w = round(max(0.0, value) / max(total, 1e-9) * width, 2)
        if w <= 0:
            continue
        out.append(f'<rect x="{round(x, 2)}" y="4" width="{w}" height="20" fill="{colour}">'
                   f'<title>{esc(name)}: {esc(seconds(value))}</title></rect>')
        x += w
    out.append("</svg>")
    return "\n".join(out)
