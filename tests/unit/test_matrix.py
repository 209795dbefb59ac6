"""docker/matrix.toml is the single source of truth: tox.ini and asv.conf.json must agree with it."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest

from harness.matrix import load_matrix, newest, tox_deps

ROOT = Path(__file__).resolve().parents[2]


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def _deps(section) -> list[str]:
    return [line.strip() for line in section.get("deps", "").splitlines() if line.strip()]


def test_every_matrix_entry_has_its_tox_env_with_the_same_pins():
    tox = _tox()
    for entry in load_matrix():
        section = f"testenv:{entry.name}"
        assert tox.has_section(section), f"tox.ini lacks [{section}] for matrix entry {entry.name}"
        assert _deps(tox[section]) == tox_deps(entry), section
        assert tox[section].get("basepython") == f"python{entry.python}", section
        setenv = dict(line.split("=", 1) for line in tox[section].get("setenv", "").split() if "=" in line)
        assert setenv == entry.env, section


def test_no_tox_env_pins_tensorflow_outside_the_matrix():
    names = {e.name for e in load_matrix()} | {"gpu", "bench", "lint"}
    pinned = [s for s in _tox().sections() if s.startswith("testenv:") and s.split(":", 1)[1] not in names]
    assert pinned == [], f"tox envs not in docker/matrix.toml: {pinned}"


def test_default_gpu_and_bench_envs_and_asv_use_the_newest_entry():
    tox, top = _tox(), newest(load_matrix())
    assert _deps(tox["testenv"]) == tox_deps(top)
    assert _deps(tox["testenv:bench"]) == tox_deps(top)
    assert _deps(tox["testenv:gpu"]) == [d.replace("tensorflow-cpu", "tensorflow[and-cuda]") for d in tox_deps(top)]
    asv = json.loads((ROOT / "asv.conf.json").read_text())
    assert asv["matrix"]["req"] == {"tensorflow-cpu": [top.tensorflow], "keras": [top.keras]}
    assert asv["pythons"] == [top.python]


def test_the_legacy_entry_is_keras_2_on_the_newest_tensorflow():
    entries = {e.name: e for e in load_matrix()}
    assert entries["legacy"].keras_major == 2 and entries["legacy"].env == {"TF_USE_LEGACY_KERAS": "1"}
    assert entries["legacy"].tensorflow == newest(list(entries.values())).tensorflow
    assert entries["tf215"].keras_major == 2 and entries["tf216"].keras_major == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "needs \\[\\[entry\\]\\] tables"),
        ('[[entry]]\nname = "x"\n', "missing tensorflow, keras"),
        ('[[entry]]\nname = "Bad-Name"\ntensorflow = "2.21.0"\nkeras = "3"\npython = "3.11"\ncuda = "12.5"\n'
         'cudnn = "9.3"\ngpu_base = "b"\nnewest = true\n', "name must be lower-case"),
        ('[[entry]]\nname = "a"\ntensorflow = "latest"\nkeras = "3"\npython = "3.11"\ncuda = "12.5"\n'
         'cudnn = "9.3"\ngpu_base = "b"\nnewest = true\n', "tensorflow must be a version like 2.21.0; got 'latest'"),
        ('[[entry]]\nname = "a"\ntensorflow = "2.21.0"\nkeras = "3"\npython = "3.11"\ncuda = "12.5"\n'
         'cudnn = "9.3"\ngpu_base = "b"\n', "exactly one entry must say newest"),
    ],
)
def test_bad_matrix_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_matrix(path)
