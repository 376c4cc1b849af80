"""Runs PyTorch's flight recorder analyzer on the dumps of a stalled attempt; mgpu runs this file as
a program of its own with the tasks' Python (where torch is), never importing torch itself.

Usage: python fr_analyze.py DUMP_FOLDER

The folder holds rank_<rank>.json, each rank's recorder as torch's worker server answered it
(`fr_trace_json`). The analyzer reads pickles named <prefix><rank>: each dump is written as one,
in a temporary folder. Gloo's dumps (torch 2.13) list the default process group under the name ""
while its entries name it: that group is given the entries' name, which the analyzer looks for.
Standard library and torch only; what it prints is read by fr_verdict.py."""

import json
import os
import pickle
import re
import sys
import tempfile

NO_TORCH = "mgpu-fr: no torch"
NO_DUMPS = "mgpu-fr: no dumps"
DUMP_LIMIT = 64 << 20
_NAME = re.compile(r"^rank_(\d{1,6})\.json$")


def _named_groups(dump: dict) -> dict:
    config = dump.get("pg_config")
    entries = dump.get("entries")
    if not isinstance(config, dict) or "" not in config or not isinstance(entries, list):
        return dump
    unnamed = config.pop("")
    for entry in entries:
        group = entry.get("process_group") if isinstance(entry, dict) else None
        if isinstance(group, list) and len(group) == 2 and group[0] not in config:
            config[group[0]] = {**unnamed, "name": group[0], "desc": group[1]}
    return dump


def main(folder: str) -> int:
    try:
        from torch.distributed.flight_recorder import fr_trace
    except ImportError:
        print(NO_TORCH, flush=True)
        return 3
    with tempfile.TemporaryDirectory(prefix="mgpu-fr-") as pickles:
        count = 0
        for name in sorted(os.listdir(folder)):
            match = _NAME.match(name)
            path = os.path.join(folder, name)
            if match is None or not os.path.isfile(path) or os.path.getsize(path) > DUMP_LIMIT:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    dump = json.load(f)
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(dump, dict):
                with open(os.path.join(pickles, f"rank_{int(match.group(1))}"), "wb") as f:
                    pickle.dump(_named_groups(dump), f)
                count += 1
        if count == 0:
            print(NO_DUMPS, flush=True)
            return 4
        fr_trace.main([pickles, "--prefix", "rank_", "--allow-incomplete-ranks"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
