"""What of a task's text the console may show.

A task's bytes are the task's business in its log, but on a terminal they are commands: ESC
sequences move the cursor, clear lines, retitle the window; a carriage return rewrites the
line from its start, so a task could overwrite its own prefix and forge the launcher's lines.
"""

from __future__ import annotations

import re

# C0 controls but tab, DEL, C1 controls, and the bidirectional overrides that reorder what follows.
_UNSAFE_ON_CONSOLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def console_safe(text: str) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`, `\\x0d`, `\\u202e`)."""
    return _UNSAFE_ON_CONSOLE.sub(_escape, text)
