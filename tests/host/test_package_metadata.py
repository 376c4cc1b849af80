"""The installed version of a distribution, read from its metadata folder without importing
importlib.metadata (launcher/host/packages.py): the host check's TensorFlow version when the tasks do
not import TensorFlow."""

import importlib.metadata

from launcher.host import packages


def test_every_distribution_installed_here_has_the_version_importlib_metadata_gives():
    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
    assert len(names) > 20  # the venv's packages were found
    found = {name: (packages.installed_version([name]), importlib.metadata.version(name)) for name in names}
    assert {name: versions for name, versions in found.items() if versions[0] != versions[1]} == {}


def test_names_are_matched_as_installers_spell_them(tmp_path):
    wheel = tmp_path / "tensorflow_cpu-2.20.0.dist-info"
    wheel.mkdir()
    (wheel / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 2.20.0\n\nVersion: 9\n")
    (tmp_path / "tf_nightly-2.22.0.dev1-py3.11.egg-info").write_text("Name: tf-nightly\nVersion: 2.22.0.dev1\n")
    path = [str(tmp_path)]
    assert packages.installed_version(["Tensorflow.CPU"], path) == "2.20.0"
    assert packages.installed_version(["tf-nightly"], path) == "2.22.0.dev1"
    assert packages.installed_version(["tensorflow"], path) is None
    assert packages.installed_version(packages.TENSORFLOW_DISTRIBUTIONS, path) == "2.20.0"


def test_the_first_name_wins_then_the_first_folder_of_the_path(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder, name, version in ((first, "tensorflow_gpu", "2.1.0"), (second, "tensorflow", "2.19.0"),
                                  (second, "tensorflow_gpu", "2.2.0")):
        info = folder / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Name: {name}\nVersion: {version}\n")
    path = [str(tmp_path / "missing"), str(first), str(second)]
    assert packages.installed_version(["tensorflow", "tensorflow-gpu"], path) == "2.19.0"
    assert packages.installed_version(["tensorflow-gpu"], path) == "2.1.0"
