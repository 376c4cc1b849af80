"""Trainer tests. Helpers live in trainer_helpers.py (importable: see below)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # for `import trainer_helpers`
