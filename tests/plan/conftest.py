"""Plan tests. Helpers shared by several files live in this folder (importable: see below)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # for `import job_env_helpers`
