"""metrics.json and eval_results.json are written into a model dir others may write to."""

import json
import os

from launcher.trainer import outdirs


def test_write_json_ignores_links_planted_in_the_model_dir(tmp_path):
    """Links under predictable temporary names, and in place of the file itself, redirect nothing."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    model_dir = tmp_path / "run1"
    model_dir.mkdir()
    target = model_dir / "metrics.json"
    for name in (f"metrics.json.tmp-{os.getpid()}", "metrics.json.tmp"):
        (model_dir / name).symlink_to(victim)
    target.symlink_to(victim)

    outdirs.write_json(str(target), {"step": 3})

    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and json.loads(target.read_text()) == {"step": 3}
    leftovers = {p.name for p in model_dir.iterdir()} - {"metrics.json"}
    assert leftovers == {f"metrics.json.tmp-{os.getpid()}", "metrics.json.tmp"}  # the planted links only


def test_write_json_replaces_the_previous_file(tmp_path):
    target = tmp_path / "eval_results.json"
    outdirs.write_json(str(target), {"a": 1})
    outdirs.write_json(str(target), {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["eval_results.json"]
