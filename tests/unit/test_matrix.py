"""docker/matrix.toml is the single source of truth: tox.ini and asv.conf.json must agree with it."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest

from harness.ci.matrix import load_matrix, newest, tox_deps

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
        setenv = dict(line.strip().split("=", 1) for line in tox[section].get("setenv", "").splitlines() if "=" in line)
        # A Keras 2 env declares it, so that scripts/check-skips allows its Keras 3 skips there and nowhere else; an env
        # without the jax extra declares nojax (its tests of Keras 3 on JAX skip there and nowhere else).
        context = setenv.pop("HARNESS_SKIP_CONTEXT", "").split()
        assert setenv == entry.env, section
        extras = [e.strip() for e in tox[section].get("extras", tox["testenv"]["extras"]).split(",")]
        assert sorted(context) == sorted((["keras2"] if entry.keras_major == 2 else [])
                                         + ([] if "jax" in extras else ["nojax"])), section


def test_no_tox_env_pins_tensorflow_outside_the_matrix():
    names = {e.name for e in load_matrix()} | {"gpu", "bench", "lint", "docker", "types"}
    tox = _tox()
    pinned = [s for s in tox.sections() if s.startswith("testenv:") and s.split(":", 1)[1] not in names
              and any(d.startswith("tensorflow") for d in _deps(tox[s]))]
    assert pinned == [], f"tox envs pinning TensorFlow, not in docker/matrix.toml: {pinned}"
    # jax011: Keras 3 on JAX without TensorFlow (its deps replace the default env's)
    assert not any(d.startswith(("tensorflow", "tf-keras")) for d in _deps(tox["testenv:jax011"]))


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


_TF = ('[[entry]]\nname = "a"\ntensorflow = "2.21.0"\nkeras = "3"\npython = "3.11"\ncuda = "12.5"\n'
       'cudnn = "9.3"\ngpu_base = "b"\nnewest = true\n')
_JAX = ('[[entry]]\nname = "j"\nbackend = "jax"\njax = "0.11.2"\nkeras = "3.15.1"\npython = "3.12"\ncuda = "12.6"\n'
        'cudnn = "9.10"\ngpu_base = "b"\n')


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
        # the jax entries: no TensorFlow, a JAX version; and the converse
        (_TF + _JAX.replace('backend = "jax"\n', 'backend = "jax"\ntensorflow = "2.21.0"\n'),
         "entry 2 \\(j\\): tensorflow must be absent or empty on a backend = 'jax' entry .*got tensorflow = '2.21.0'"),
        (_TF + _JAX.replace('jax = "0.11.2"\n', ""), "entry 2 \\(j\\): missing jax \\(backend = 'jax'\\)"),
        (_TF + _JAX.replace('jax = "0.11.2"', 'jax = "latest"'), "entry 2 \\(j\\): jax must be a version like 0.11.2"),
        (_TF + _JAX.replace('keras = "3.15.1"', 'keras = "tf-keras 2.21.0"'),
         "entry 2 \\(j\\): keras must be a pinned Keras 3 version like 3.15.1 on a backend = 'jax' entry"),
        (_TF.replace('tensorflow = "2.21.0"\n', 'tensorflow = "2.21.0"\njax = "0.11.2"\n'),
         "entry 1 \\(a\\): jax must be absent or empty on a backend = 'tensorflow' entry .*got jax = '0.11.2'"),
        (_TF.replace('name = "a"\n', 'name = "a"\nbackend = "torch"\n'),
         "entry 1 \\(a\\): backend must be one of \\['tensorflow', 'jax'\\]; got 'torch'"),
        (_TF.replace("newest = true\n", "") + _JAX + "newest = true\n",
         "entry j says newest = true but has backend = 'jax'.*must be a TensorFlow entry"),
    ],
)
def test_bad_matrix_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_matrix(path)


def test_the_bake_file_is_the_one_generated_from_the_matrix():
    from harness.ci.matrix import bake_file

    committed = (ROOT / "docker" / "docker-bake.hcl").read_text()
    assert committed == bake_file(load_matrix()), (
        "docker/docker-bake.hcl is stale: python -m harness.ci.matrix bake > docker/docker-bake.hcl")


def test_the_bake_file_parses_as_hcl_with_one_target_per_entry_and_variant():
    hcl2 = pytest.importorskip("hcl2")
    from harness.ci.matrix import build_args

    with open(ROOT / "docker" / "docker-bake.hcl") as f:
        parsed = hcl2.load(f)
    targets = {name.strip('"'): body for block in parsed["target"] for name, body in block.items()}
    for entry in load_matrix():
        for variant, name in (("cpu", entry.name), ("gpu", f"{entry.name}-gpu")):
            args = {k: v.strip('"') for k, v in targets[name]["args"].items()}
            want = build_args(entry, variant, cpu_base="${CPU_BASE}") | {"OFFLINE": "${OFFLINE}"}
            assert args == want, name
            assert [t.strip('"') for t in targets[name]["tags"]] == [f"harness:{name}"]
    assert len(targets) == 2 * len(load_matrix()) + 1  # + "_common"


def test_harness_own_bake_file_and_the_one_harness_init_writes_are_one_template_rendered(tmp_path, monkeypatch):
    # matrix.bake_file wrote harness' docker-bake.hcl line by line in Python, and harness init's bake file
    # came from a template of the same layout: two generators of one HCL. One template renders both now
    # (harness-bake.hcl.j2 in harness/ci/templates, render_bake filling its values); the layout each file must have is
    # checked above (harness' own) and in tests/unit/test_adopt_ci.py (the adopter's).
    from harness.ci import adopt, matrix
    from harness.project import parse_config

    rendered: list[str] = []
    real = matrix.render_template
    monkeypatch.setattr(matrix, "render_template", lambda name, **values: rendered.append(name) or real(name, **values))
    own = matrix.bake_file(load_matrix())
    project = parse_config({"matrix": ["tf221", "legacy"], "workloads": {"m": {"model": "pkg.m:build"}}},
                           tmp_path / "harness.toml")
    theirs = adopt.ci_files(project, "pkg")["docker/harness-bake.hcl"]
    assert rendered == ["harness-bake.hcl.j2", "harness-bake.hcl.j2"]
    assert own == (ROOT / "docker" / "docker-bake.hcl").read_text()  # the committed file, byte for byte
    assert 'target "legacy-gpu" {\n  inherits = ["_common"]\n  tags     = ["pkg-harness:legacy-gpu"]\n' in theirs


def test_the_bake_check_fails_when_the_matrix_moves(tmp_path):
    # the guard above, shown failing: a TF bump in the matrix without regenerating the bake file
    from harness.ci.matrix import bake_file

    text = (ROOT / "docker" / "matrix.toml").read_text().replace('tensorflow = "2.20.0"', 'tensorflow = "2.20.1"')
    moved = tmp_path / "matrix.toml"
    moved.write_text(text)
    assert bake_file(load_matrix(moved)) != (ROOT / "docker" / "docker-bake.hcl").read_text()


def test_build_args_pin_the_variant_and_keras_of_each_entry():
    from harness.ci.matrix import build_args

    entries = {e.name: e for e in load_matrix()}
    legacy = build_args(entries["legacy"], "gpu")
    assert legacy["FRAMEWORK_REQUIREMENT"] == "tensorflow[and-cuda]==2.21.0"
    assert legacy["KERAS_REQUIREMENT"] == "tf-keras==2.21.0" and legacy["TF_USE_LEGACY_KERAS"] == "1"
    assert legacy["BASE_IMAGE"] == entries["legacy"].gpu_base
    tf215 = build_args(entries["tf215"])
    assert tf215["FRAMEWORK_REQUIREMENT"] == "tensorflow-cpu==2.15.1" and tf215["KERAS_REQUIREMENT"] == ""
    assert tf215["KERAS_BACKEND"] == "tensorflow" and tf215["JAX"] == "none" and tf215["TENSORFLOW"] == "2.15.1"
    assert tf215["BASE_IMAGE"].startswith("debian:bookworm")
    with pytest.raises(ValueError, match="variant must be one of \\['cpu', 'gpu'\\]; got variant='tpu'"):
        build_args(entries["tf215"], "tpu")


def test_the_dockerfile_declares_every_build_arg():
    from harness.ci.matrix import build_args

    text = (ROOT / "docker" / "Dockerfile").read_text()
    for key in [*build_args(load_matrix()[0]), "OFFLINE"]:
        assert f"ARG {key}=" in text, key


def test_matrix_module_cli_prints_json_and_build_args(capsys):
    from harness.ci.matrix import main

    assert main(["json"]) == 0
    assert [e["name"] for e in json.loads(capsys.readouterr().out)] == [e.name for e in load_matrix()]
    assert main(["build-args", "tf221", "--gpu"]) == 0
    assert "--build-arg=FRAMEWORK_REQUIREMENT=tensorflow[and-cuda]==2.21.0" in capsys.readouterr().out.splitlines()
    assert main(["build-args", "jax011"]) == 0
    assert "--build-arg=FRAMEWORK_REQUIREMENT=jax==0.11.2 jaxlib==0.11.2" in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit):
        main(["build-args", "tf999"])
    assert "got 'tf999'" in capsys.readouterr().err


def test_a_good_jax_entry_loads_beside_a_tensorflow_one(tmp_path):
    path = tmp_path / "matrix.toml"
    path.write_text(_TF + _JAX)
    tf, jax = load_matrix(path)
    assert (tf.backend, tf.has_tensorflow, tf.jax, tf.tf_minor) == ("tensorflow", True, "", "2.21")
    assert (jax.backend, jax.has_tensorflow, jax.tensorflow, jax.tf_minor) == ("jax", False, "", "")
    assert (jax.framework, tf.framework) == ("JAX 0.11.2", "TensorFlow 2.21.0")


def test_the_jax_entry_is_keras_3_on_jax_without_tensorflow_in_its_tox_env_and_images():
    from harness.ci.matrix import build_args

    entries = {e.name: e for e in load_matrix()}
    jax = entries["jax011"]
    assert (jax.backend, jax.jax, jax.tensorflow, jax.keras, jax.python) == ("jax", "0.11.2", "", "3.15.1", "3.12")
    assert tox_deps(jax) == ["keras==3.15.1", "jax==0.11.2", "jaxlib==0.11.2"]  # tox.ini's [testenv:jax011] order
    assert not jax.newest and newest(list(entries.values())).name == "tf221"  # asv and tox's default stay on TF
    cpu, gpu = build_args(jax, "cpu"), build_args(jax, "gpu")
    assert cpu["FRAMEWORK_REQUIREMENT"] == "jax==0.11.2 jaxlib==0.11.2" and cpu["KERAS_REQUIREMENT"] == "keras==3.15.1"
    assert gpu["FRAMEWORK_REQUIREMENT"] == "jax[cuda12]==0.11.2 jaxlib==0.11.2"
    for args in (cpu, gpu):
        assert (args["KERAS_BACKEND"], args["TENSORFLOW"], args["JAX"], args["PYTHON"]) == ("jax", "none", "0.11.2",
                                                                                          "3.12")
    # Python 3.12: Ubuntu 24.04 has it (Debian bookworm, the TensorFlow entries' CPU base, has 3.11), on both variants
    assert cpu["BASE_IMAGE"] == "ubuntu:24.04" == build_args(jax, "cpu", cpu_base="${CPU_BASE}")["BASE_IMAGE"]
    assert gpu["BASE_IMAGE"] == jax.gpu_base and jax.gpu_base.startswith(f"nvidia/cuda:{jax.cuda}.")
    assert jax.gpu_base.endswith("-base-ubuntu24.04")
    assert build_args(entries["tf221"], "cpu", cpu_base="${CPU_BASE}")["BASE_IMAGE"] == "${CPU_BASE}"


def test_harness_docker_runs_in_a_jax_image_what_the_jax_tox_env_runs():
    # The TensorFlow suite cannot be collected without TensorFlow: the image of a jax entry runs its tox env's tests.
    from harness.cli.docker import NO_TF_PATHS, suite_paths

    tox, entries = _tox(), {e.name: e for e in load_matrix()}
    command = tox["testenv:jax011"]["commands"].split()
    assert [arg for arg in command if arg.startswith("tests/")] == list(NO_TF_PATHS)
    assert suite_paths(entries["jax011"]) == NO_TF_PATHS and suite_paths(entries["tf221"]) == ()


def test_the_dockerfile_makes_keras_backend_the_images_environment():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "    KERAS_BACKEND=${KERAS_BACKEND} \\\n" in text and 'io.harness.jax="${JAX}"' in text
    assert 'read -ra framework <<< "${FRAMEWORK_REQUIREMENT}"' in text and "TF_REQUIREMENT" not in text
