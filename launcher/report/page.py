"""The report as one HTML page: its style inline, its pictures inline SVG, no script, nothing
fetched, so it opens from a laptop's disk or an email attachment in any browser. Every text comes
from the run's record and is escaped here or in svg.py."""

from __future__ import annotations

import datetime
from typing import Sequence

from launcher.report import svg
from launcher.report.story import Story, Table
from launcher.report.svg import esc, seconds

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #212121; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
code, pre, .mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: #f6f6f6; padding: 8px; white-space: pre-wrap; word-break: break-word; margin: 4px 0; }
table { border-collapse: collapse; margin: 6px 0; } td, th { border: 1px solid #ddd; padding: 3px 8px;
  text-align: left; vertical-align: top; } th { background: #f3f3f3; }
td.detail { max-width: 640px; word-break: break-word; font-family: ui-monospace, Menlo, Consolas, monospace; }
.status { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; background: #78909c; }
.status.succeeded { background: #2e7d32; } .status.failed, .status.launcher-died, .status.stalled,
.status.start-timeout { background: #c62828; } .status.running { background: #1565c0; }
.goodput { font-size: 28px; font-weight: 600; } .muted { color: #666; }
svg text { font: 12px system-ui, sans-serif; fill: #212121; } svg .tick { fill: #666; text-anchor: middle; }
svg .axis { stroke: #999; } svg .grid { stroke: #eee; } svg .ready { stroke: #000; stroke-width: 2; }
svg .restart { stroke: #c62828; stroke-dasharray: 4 3; } svg .restart-label { fill: #c62828; }
svg .in-bar { fill: #fff; font-size: 10px; } svg .in-cell { font-size: 10px; }
.legend span { display: inline-block; margin-right: 14px; } .legend i { display: inline-block; width: 12px;
  height: 12px; margin-right: 4px; vertical-align: -1px; }
"""


def table(t: Table, detail: Sequence[str] = ()) -> str:
    if not t.rows:
        return '<p class="muted">none</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f'<td class="detail">{esc(v)}</td>' if c in detail else f"<td>{esc(v)}</td>"
                                    for c, v in zip(t.columns, row)) + "</tr>" for row in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _when(at: float | None) -> str:
    return f"+{seconds(at)}" if at is not None else "-"


def _head(story: Story) -> str:
    status = esc(story.status or "?")
    ended = f", ended {esc(story.ended_at)}" if story.ended_at else ""
    message = f"<pre id=\"message\">{esc(story.message)}</pre>" if story.message else ""
    commands = "".join(f"<pre class=\"command\">{esc(c)}</pre>" for c in story.commands) or '<p class="muted">-</p>'
    if story.launched_with:
        commands = (f'<p class="muted">launched with</p><pre id="launched-with">{esc(story.launched_with)}</pre>'
                    f'<p class="muted">the tasks ran</p>{commands}')
    return (f'<h1>mgpu run <span class="mono">{esc(story.run_id)}</span> <span class="status {status}" id="status">'
            f'{status}</span></h1><p class="muted">started {esc(story.started_at)}{ended}; '
            f'{esc(seconds(story.wall))} of wall time; {_count(len(story.tasks), "task")} on '
            f'{_count(len(story.hosts.rows), "host")}; {_count(len(story.restarts), "restart")}</p>{message}'
            f'<h2 id="command">The command and hosts</h2>{commands}{table(story.hosts)}'
            f'<details><summary>supervision settings</summary>{table(story.settings)}</details>')


def _timeline(story: Story) -> str:
    legend = "".join(f'<span><i style="background:{colour}"></i>{esc(name)}</span>' for name, colour in (
        ("exited 0", svg.COLOURS["ok"]), ("charged with the failure", svg.COLOURS["fault"]),
        ("stopped or failed", svg.COLOURS["stopped"]), ("still running", svg.COLOURS["running"])))
    return (f'<h2 id="timeline">Timeline</h2><p class="muted">A row per task, a bar per attempt: pale from its '
            f'start until it was ready (the black mark), solid after. Hover a bar for its details.</p>'
            f'<p class="legend">{legend}</p>{svg.timeline(story)}')


def _restarts(story: Story) -> str:
    rows = "".join(f'<tr class="restart"><td>{esc(r.attempt)}</td><td>{esc(_when(r.at))}</td>'
                   f'<td class="cause">{esc(r.cause)}</td><td>{esc(r.task)}</td><td>{esc(r.host)}</td>'
                   f'<td class="detail">{esc(r.detail)}</td></tr>' for r in story.restarts)
    restarts = (f"<table><thead><tr><th>attempt</th><th>failed at</th><th>cause</th><th>task</th><th>host</th>"
                f"<th>detail</th></tr></thead><tbody>{rows}</tbody></table>" if rows else
                '<p class="muted">no attempt failed</p>')
    out = [f'<h2 id="restarts">Failed attempts and their causes</h2>{restarts}']
    if story.left_out:
        rows = "".join(f"<tr><td>{esc(h.host)}</td><td>{esc(h.cause)}</td><td>{esc(_when(h.at))}</td>"
                       f"<td>{esc(h.replaced_by or '(no spare)')}</td></tr>" for h in story.left_out)
        out.append(f'<h2 id="left-out">Hosts left out</h2><table><thead><tr><th>host</th><th>cause</th>'
                   f'<th>at</th><th>its tasks taken by</th></tr></thead><tbody>{rows}</tbody></table>')
    return "".join(out)


def _costs(story: Story) -> str:
    figures = dict(story.costs.rows)
    shown = f"{100 * story.goodput:.1f}%" if story.goodput is not None else "unknown"
    meaning = ("the share of the wall time spent on new steps: steps above the best any earlier attempt reached"
               if story.goodput is not None else "the program reported no steps, so its time cannot be split")
    out = [f'<h2 id="costs">Progress and goodput</h2><p>goodput <span class="goodput" id="goodput">{esc(shown)}</span>'
           f' <span class="muted">{esc(meaning)}</span></p>']
    if story.lost is not None:
        return "".join(out + _lost(story, figures))
    try:
        wall, lost = float(figures.get("wall_s", "")), float(figures.get("time_lost_s", ""))
    except ValueError:
        wall = lost = None
    if wall and lost is not None and 0 <= lost <= wall:
        out.append(svg.split((("good time", wall - lost, svg.COLOURS["ok"]), ("time lost", lost,
                                                                              svg.COLOURS["fault"])), wall))
    out.append(table(story.costs))
    for name, t in story.breakdowns:
        out.append(f"<h3>{esc(name)}</h3>{table(t)}")
    out.append(f"<h3>Each attempt</h3>{table(story.attempts)}")
    return "".join(out)


def _lost(story: Story, figures: dict) -> list[str]:
    """The wall time cut by cause, and the time lost by cause for the run and each attempt."""
    out = []
    try:
        wall = float(figures.get("wall_s", ""))
    except ValueError:
        wall = 0.0
    if wall > 0 and story.time_split:
        parts = [(name, seconds, svg.COLOURS["ok"] if name == "new steps" else svg.LOST_COLOURS.get(name, "#999"))
                 for name, seconds in story.time_split]
        legend = "".join(f'<span><i style="background:{colour}"></i>{esc(name)}</span>' for name, _, colour in parts)
        out.append(f'<p class="legend">{legend}</p>{svg.split(parts, wall)}')
    out.append(f'<h3 id="lost">Time lost by cause</h3>{table(story.lost)}')
    out.append(f"<details><summary>every figure of costs</summary>{table(story.costs)}</details>")
    out.extend(f"<h3>{esc(name)}</h3>{table(t)}" for name, t in story.breakdowns if name != "lost_s")
    out.append(f"<h3>Each attempt</h3>{table(story.attempts)}")
    return out


def _busy(story: Story) -> str:
    if story.busy_over_time:
        return ('<h2 id="busy">Busy share</h2><p class="muted">How much of the time each task computed rather than '
                'waited, over the run (from its samples; the row\'s mean beside its name): in a synchronous job the '
                'task the others wait for is the darkest row.</p>' + svg.busy_over_time(story))
    if not any(bar.busy is not None for bar in story.bars):
        return '<h2 id="busy">Busy share</h2><p class="muted">no busy shares recorded</p>'
    return ('<h2 id="busy">Busy share</h2><p class="muted">How much of its last window each task computed rather '
            'than waited, per attempt: in a synchronous job the task the others wait for is the darkest.</p>'
            + svg.busy(story))


def _checks(story: Story) -> str:
    if story.checks is None:
        return ('<h2 id="checks">Host checks</h2><p class="muted">no host checks\' table in the run\'s folder '
                '(checks.json: what <code>mgpu check --json</code> prints for the run\'s hosts)</p>')
    return f'<h2 id="checks">Host checks</h2>{table(story.checks, detail=("problems",))}'


def _logs(story: Story, log_links: dict[str, str], trace_link: str | None) -> str:
    rows = "".join(f'<li><a href="{esc(log_links[task])}">{esc(task)}</a> <span class="muted">{esc(name)}</span></li>'
                   for task, name in story.logs if task in log_links)
    trace = (f'<p>The timeline as a Chrome trace (open it in <a href="https://ui.perfetto.dev">Perfetto</a> or '
             f'chrome://tracing): <a href="{esc(trace_link)}" id="trace">{esc(trace_link)}</a></p>'
             if trace_link else "")
    return f'<h2 id="logs">Logs</h2><ul>{rows or "<li>none</li>"}</ul>{trace}'


def _stalls(story: Story, stall_links: dict[int, str]) -> str:
    """Each stalled attempt's evidence folder (stacks, flight recorder, README), where it is."""
    rows = "".join(f'<li class="stall">attempt {esc(s.attempt)}: <a href="{esc(stall_links[s.attempt])}">{esc(s.folder)}/</a>'
                   + "".join(f'<br><span class="muted">flight recorder: {esc(line)}</span>' for line in s.verdict)
                   + "</li>" for s in story.stalls if s.attempt in stall_links)
    return f'<h2 id="stalls">Stall evidence</h2><ul>{rows}</ul>' if rows else ""


def render(story: Story, log_links: dict[str, str], trace_link: str | None = None,
           made_at: datetime.datetime | None = None, stall_links: dict[int, str] | None = None) -> str:
    """The page. `log_links`: each task's log as a link the page may hold (relative to the page,
    or a file: URI); `trace_link`: the trace's; `stall_links`: each stalled attempt's folder's."""
    made = (made_at or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds")
    left = "".join(f"<p class=\"muted\">{esc(line)}</p>" for line in story.left)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
            f'img-src data:">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>mgpu run {esc(story.run_id)}</title><style>{STYLE}</style></head><body>\n'
            f'{_head(story)}\n{left}{_timeline(story)}\n{_restarts(story)}\n{_busy(story)}\n{_costs(story)}\n'
            f'{_checks(story)}\n{_logs(story, log_links, trace_link)}\n{_stalls(story, stall_links or {})}\n'
            f'<p class="muted">made by mgpu report at {esc(made)} from the run folder</p>\n</body></html>\n')


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"
