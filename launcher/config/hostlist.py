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

_GROUP = re.compile(r"\[([^\[\]]*)\]")
_RANGE_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
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
    pieces: list[list[str]] = []
    position = 0
    for match in _GROUP.finditer(entry):
        if not _RANGE_GROUP.match(match.group(1)):
            continue
        pieces.append([entry[position:match.start()]])
        pieces.append(_expand_group(match.group(1), entry))
        position = match.end()
    if not pieces:
        return [entry]  # nothing to expand: the host parser judges it as written
    pieces.append([entry[position:]])
    _check_brackets(entry, "".join(piece[0] for piece in pieces))
    total = 1
    for piece in pieces:
        total *= len(piece)
    if total > MAX_HOSTS:
        raise ValueError(f"{entry!r} expands to {total} hosts (at most {MAX_HOSTS})")
    return ["".join(combination) for combination in itertools.product(*pieces)]


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


def _expand_group(group: str, entry: str) -> list[str]:
    """`01-03,7` -> ['01', '02', '03', '7']."""
    values: list[str] = []
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
        width = len(low_text)
        values += [str(number).zfill(width) for number in range(low, high + 1)]
    return values


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
    """Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(f"{text!r}: {item!r} is not N or N(xR)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts
