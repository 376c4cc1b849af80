"""Slurm hostlists: `node[01-04,07]`, `rack[1-2]n[1-4]`, `a,b[1-2],c` -> one name per host.

The syntax Slurm uses in SLURM_JOB_NODELIST and that clusters use everywhere else: a bracket
group holds numbers and ranges, a range's lower bound sets the zero padding (`[08-10]` gives
08, 09, 10), several groups multiply out with the last one varying fastest, and commas outside
brackets separate entries. Order is kept as written: Slurm ranks tasks in this order, so it is
never sorted. Pure and standard library only (task-side code on Slurm nodes uses it too).
"""

from __future__ import annotations

import itertools
import re

# More names than any cluster has; stops `n[0-999999999]` from eating the machine's memory.
MAX_HOSTS = 65536
# More tasks than any cluster runs, in all (hosts times slots, every entry together). Counted
# before anything is expanded, so a few lines of ranges cannot grow into gigabytes.
MAX_TASKS = 100_000

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE_ITEM = re.compile(r"^([0-9]+)(?:-([0-9]+))?$")  # ASCII digits: \d takes any script's
# A group is a hostlist range only when it holds digits, commas and dashes; anything else in
# brackets (an IPv6 address such as [fd00::1]) is left as it is.
_RANGE_GROUP = re.compile(r"^[0-9][0-9,\s-]*$")


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: `a,n[1,3],b` -> ['a', 'n[1,3]', 'b']."""
    parts, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    parts.append(text[start:])
    return parts


def has_range(text: str) -> bool:
    """Whether `text` holds a hostlist range group such as [1-4]."""
    return any(_RANGE_GROUP.match(group) for group in _GROUP.findall(text))


def expand_entry(entry: str) -> list[str]:
    """One entry (no top-level commas) with its range groups multiplied out.

    Brackets that are not ranges stay as written, so `user@n[1-2]:2222` expands the host and
    keeps the rest, and `[fd00::1]:2222` is returned unchanged.
    """
    total = count_entry(entry)
    if total > MAX_HOSTS:
        raise ValueError(f"{entry!r} expands to {total} hosts (at most {MAX_HOSTS})")
    pieces: list[list[str]] = []
    position = 0
    for match in _GROUP.finditer(entry):
        if not _RANGE_GROUP.match(match.group(1)):
            continue
        pieces.append([entry[position:match.start()]])
        pieces.append(_expand_group(match.group(1)))
        position = match.end()
    if not pieces:
        return [entry]  # nothing to expand: the host parser judges it as written
    pieces.append([entry[position:]])
    return ["".join(combination) for combination in itertools.product(*pieces)]


def count_entry(entry: str) -> int:
    """How many hosts expand_entry(entry) gives, counted without expanding. Raises ValueError
    for a range that is not N or N-M, goes backwards, or has unbalanced brackets around it."""
    total = 1
    outside = []
    position = 0
    for match in _GROUP.finditer(entry):
        if not _RANGE_GROUP.match(match.group(1)):
            continue
        outside.append(entry[position:match.start()])
        size = sum(high - low + 1 for low, high, _ in _group_ranges(match.group(1), entry))
        total = min(total * size, _SATURATED)  # exact for any real count, bounded for absurd ones
        position = match.end()
    if outside:
        _check_brackets(entry, "".join(outside) + entry[position:])
    return total


_SATURATED = 10**18


def check_task_total(total: int) -> None:
    """Refuse a cluster of more than MAX_TASKS tasks (call it before expanding what was counted)."""
    if total > MAX_TASKS:
        raise ValueError(f"more than {MAX_TASKS} tasks, the most mgpu runs ({total} counted so far)")


def expand_hostlist(text: str) -> list[str]:
    """Every host of a hostlist, in order: `n[1-2],m5` -> ['n1', 'n2', 'm5']. Raises ValueError."""
    if not text.strip():
        raise ValueError("the host list is empty")
    hosts: list[str] = []
    for entry in split_top_level(text):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"{text!r} has an empty entry")
        hosts += expand_entry(entry)
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"{text!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


def _group_ranges(group: str, entry: str) -> list[tuple[int, int, int]]:
    """`01-03,7` -> [(1, 3, 2), (7, 7, 1)]: (low, high, zero-padded width) per item."""
    ranges = []
    for item in group.split(","):
        match = _RANGE_ITEM.match(item.strip())
        if not match:
            raise ValueError(f"{entry!r}: {item.strip()!r} in [{group}] is not a number or a range N-M")
        low_text, high_text = match.group(1), match.group(2)
        low, high = int(low_text), int(high_text if high_text is not None else low_text)
        if high < low:
            raise ValueError(f"{entry!r}: range {item.strip()} goes backwards")
        if high - low >= MAX_HOSTS:
            raise ValueError(f"{entry!r}: range {item.strip()} has more than {MAX_HOSTS} hosts")
        ranges.append((low, high, len(low_text)))
    return ranges


def _expand_group(group: str) -> list[str]:
    """`01-03,7` -> ['01', '02', '03', '7'] (the group was checked by count_entry)."""
    return [str(number).zfill(width) for low, high, width in _group_ranges(group, group)
            for number in range(low, high + 1)]


def _check_brackets(entry: str, outside_ranges: str) -> None:
    """Refuse brackets left unbalanced or nested outside the range groups."""
    depth = 0
    for char in outside_ranges:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError(f"{entry!r}: unbalanced brackets")
    if depth:
        raise ValueError(f"{entry!r}: unbalanced brackets")


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1].

    Counted before it is expanded: at most MAX_HOSTS nodes and MAX_TASKS tasks in all."""
    items = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", item)
        if not match:
            raise ValueError(f"{text!r}: {item!r} is not N or N(xR)")
        items.append((int(match.group(1)), int(match.group(2) or 1)))
    nodes = sum(repeat for _, repeat in items)
    if nodes > MAX_HOSTS:
        raise ValueError(f"{text!r} describes {nodes} nodes (at most {MAX_HOSTS})")
    check_task_total(sum(count * repeat for count, repeat in items))
    return [count for count, repeat in items for _ in range(repeat)]
