"""The course's set-up files agree with each other."""

import json
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _extras():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_environment_yml_and_pyproject_pin_the_same_packages():
    """environment.yml is the CPU lane's environment: the course's tools and the cpu-lane torch and triton."""
    course = _extras()["course"] + _extras()["cpu-lane"]
    conda = [ln.strip().removeprefix("- ") for ln in (ROOT / "environment.yml").read_text().splitlines()]
    assert _pins(course) == _pins(conda)
    assert "-e ." in conda


def test_the_gpu_lane_pins_the_versions_every_gpu_record_ran_on():
    """One tested matrix: a learner with a GPU installs the torch and triton that the GPU lane ran on here.
    Before, every machine got the CPU lane's torch 2.13 / triton 3.7, which no GPU here had run. Each row of
    a shipped record measured on an NVIDIA GPU names its versions; they must be the gpu-lane pins."""
    import csv

    pins = _pins(_extras()["gpu-lane"])
    assert set(pins) == {"torch", "triton"}
    assert not set(pins) & set(_pins(_extras()["course"])), "torch and triton are pinned per lane only"
    seen = set()
    for path in sorted((ROOT / "labkernels" / "reference").glob("*.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row.get("device", "").startswith("NVIDIA"):
                    seen.add((row["torch"].split("+")[0], row["triton"]))
    assert seen == {(pins["torch"], pins["triton"])}, f"GPU records ran on {seen}; gpu-lane pins {pins}"


def test_package_requirements_are_lower_bounds_only():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any("==" in d for d in deps), "pin exact versions only in the course extra"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def test_every_ignored_cell_says_why():
    """nbval ignores a cell's output through its `nbval-ignore-output` tag; the first line of the cell says
    so to the reader, with the reason: `# NBVAL_IGNORE_OUTPUT — <reason>`. Neither goes without the other."""
    import nbformat

    for folder in ("notebooks", "notebooks/appendix", "solutions"):
        for path in (ROOT / folder).glob("*.ipynb"):
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type != "code":
                    continue
                tagged = "nbval-ignore-output" in cell.metadata.get("tags", [])
                marker = [ln for ln in cell.source.splitlines() if "NBVAL_IGNORE_OUTPUT" in ln]
                assert tagged == bool(marker), f"{path.name}: tag and comment disagree: {cell.source[:60]!r}"
                for line in marker:
                    reason = line.strip().removeprefix("# NBVAL_IGNORE_OUTPUT").strip(" —-:")
                    assert len(reason) > 8, f"{path.name}: an ignored cell must say why: {line!r}"


# --- the instructors' set-up -----------------------------------------------------------------------------


def _instructors_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("instructors_check", ROOT / "instructors" / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_instructors_check_passes():
    """`python instructors/check.py` (the image installs what the Makefile installs, the hub config loads
    and starts servers with the course): before, it exited 1 on the Makefile's --no-compile."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "instructors/check.py"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_kubernetes_learner_server_starts_with_the_course(tmp_path, monkeypatch):
    """The rendered Kubernetes config: each profile's volume over the course folder is first filled by an
    init container of its image (before, an empty claim hid the course and the package). Its copy command,
    run here on folders standing for the image's course and a learner's volume, fills an empty volume and
    keeps a learner's file."""
    import subprocess

    check = _instructors_check()
    monkeypatch.setenv("LABKERNELS_SPAWNER", "kubernetes")
    config = check.load_config("kubernetes")
    assert check.course_volume_problems(config) == []
    course = "/home/jovyan/course"
    profiles = config.KubeSpawner.profile_list
    for k, profile in enumerate(profiles):
        (init,) = profile["kubespawner_override"]["init_containers"]
        assert init["image"] == profile["kubespawner_override"]["image"]
        image_course, volume = tmp_path / f"image{k}" / "course", tmp_path / f"volume{k}"
        (image_course / "notebooks").mkdir(parents=True)
        (image_course / "notebooks" / "00.ipynb").write_text("course")
        (image_course / ".hidden").write_text("course")
        mount = init["volumeMounts"][0]["mountPath"]
        command = [
            part.replace(course, str(image_course)).replace(mount, str(volume)) for part in init["command"]
        ]
        volume.mkdir()
        subprocess.run(command, check=True, timeout=60)  # a new, empty volume
        assert (volume / "notebooks" / "00.ipynb").read_text() == "course" and (volume / ".hidden").exists()
        (volume / "notebooks" / "00.ipynb").write_text("my answers")
        subprocess.run(command, check=True, timeout=60)  # the learner's next start
        assert (volume / "notebooks" / "00.ipynb").read_text() == "my answers"
    # the check fails a config whose volume hides the course
    for profile in profiles:
        profile["kubespawner_override"]["init_containers"] = []
    assert len(check.course_volume_problems(config)) == len(profiles)


# --- make lab -----------------------------------------------------------------------------------------------


def _fake_venv(tmp_path):
    """A venv for the Makefile whose `jupyter` only prints its arguments: `make lab` runs up to the server's
    start without starting one."""
    import os
    import sys

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, venv / "bin" / "python")
    jupyter = venv / "bin" / "jupyter"
    jupyter.write_text(f'#!/bin/sh\necho "jupyter $*" | tee -a {venv / "jupyter.log"}\n')
    jupyter.chmod(0o755)
    (venv / ".installed").touch()  # newer than pyproject.toml: installed
    return venv


def _make(*args, timeout=120):
    """make in the project, for a CPU-lane venv (`_fake_venv`) whatever this machine has: on a GPU machine the
    default lane is gpu, and a venv built for the cpu lane would be rebuilt."""
    import subprocess

    command = ["make", "--no-print-directory", "LANE=cpu", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_make_lab_never_prints_a_url_it_does_not_serve(tmp_path):
    """Port taken: before, the URL named it while Jupyter moved to the next port (and the link reached the
    other server, with the wrong token). Now the URL's port is the one served, and Jupyter may not move."""
    import re
    import socket

    venv = _fake_venv(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _make("lab", f"VENV={venv}", f"PORT={port}")
    assert done.returncode == 0, done.stdout + done.stderr
    url = re.search(r"http://127\.0\.0\.1:(\d+)/lab/tree/README\.md\?token=(\w+)", done.stdout)
    served = re.search(
        r"jupyter lab .*--port=(\d+) --ServerApp\.port_retries=0 --IdentityProvider\.token=(\w+)", done.stdout
    )
    assert url and served, done.stdout
    assert url.groups() == served.groups() and int(url.group(1)) != port
    assert f"Port {port} is in use" in done.stdout
    assert "*.egg-info" in done.stdout  # hidden in the file browser
    assert "jupyter trust notebooks/" in (venv / "jupyter.log").read_text()  # notebooks open trusted


def test_make_lab_with_other_torch_pip_args_rebuilds_the_venv(tmp_path):
    """Before, `make lab TORCH_PIP_ARGS=...` did nothing once .venv existed (pip kept the torch it had)."""
    venv = _fake_venv(tmp_path)
    (venv / ".torch-pip-args").write_text("--index-url https://example.invalid/a")
    same = _make("-n", "venv", f"VENV={venv}", "TORCH_PIP_ARGS=--index-url https://example.invalid/a")
    assert "rebuilding" not in same.stdout and "pip install" not in same.stdout, same.stdout
    other = _make("-n", "venv", f"VENV={venv}", "TORCH_PIP_ARGS=--index-url https://example.invalid/cpu")
    assert "differs from what .venv was built with" in other.stdout, other.stdout + other.stderr
    assert f"rm -rf {venv}" in other.stdout
    assert '--index-url https://example.invalid/cpu "torch==' in other.stdout
    plain = _make("-n", "venv", f"VENV={venv}")  # no arguments: the installed torch stays
    assert "pip install" not in plain.stdout, plain.stdout


def test_make_lab_installs_the_pins_of_this_machines_lane(tmp_path):
    """Where `nvidia-smi -L` names a GPU, the venv gets the gpu-lane extra and its torch; elsewhere the
    cpu-lane's; LANE= says it outright. A venv built for the other lane is rebuilt (pip keeps a torch)."""
    import os

    torch_pins = {lane: _pins(_extras()[f"{lane}-lane"])["torch"] for lane in ("cpu", "gpu")}
    assert torch_pins["cpu"] != torch_pins["gpu"]
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    smi.chmod(0o755)
    import shutil

    env_gpu = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    env_cpu = dict(os.environ)
    # On a machine with a GPU driver, the cpu lane is asked for by name (the auto choice is the gpu's above).
    cpu_args = ["LANE=cpu"] if shutil.which("nvidia-smi") else []
    for env, lane, args in ((env_gpu, "gpu", []), (env_cpu, "cpu", cpu_args)):
        venv = tmp_path / f"new-{lane}"
        done = _make_env(env, "-n", "venv", f"VENV={venv}", *args)
        assert done.returncode == 0, done.stderr
        assert f'"torch=={torch_pins[lane]}"' in done.stdout and f'".[course,{lane}-lane]"' in done.stdout
        assert f"printf '%s' \"{lane}\" > {venv}/.lane" in done.stdout
    built_for_cpu = _fake_venv(tmp_path)  # no .lane file: built before lanes, with the cpu pins
    stays = _make_env(env_cpu, "-n", "venv", f"VENV={built_for_cpu}", *cpu_args)
    assert "rebuilding" not in stays.stdout and "pip install" not in stays.stdout, stays.stdout
    moves = _make_env(env_gpu, "-n", "venv", f"VENV={built_for_cpu}")
    assert "LANE=gpu differs from the lane .venv was built for (cpu)" in moves.stdout, moves.stdout
    assert f"rm -rf {built_for_cpu}" in moves.stdout and f'"torch=={torch_pins["gpu"]}"' in moves.stdout
    wrong = _make_env(env_cpu, "-n", "venv", "LANE=tpu")
    assert wrong.returncode != 0 and 'LANE is "tpu": it must be cpu or gpu' in wrong.stderr


def _make_env(env, *args):
    import subprocess

    command = ["make", "--no-print-directory", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def test_make_test_newest_runs_the_cpu_lane_on_unpinned_releases():
    """`make test-newest`: a venv of its own, torch and triton without a pin (the newest on the index), then
    the unit tests and nbval in it, with an extension cache of its own."""
    done = _make("-n", "test-newest", "VENV=/nonexistent")
    lines = done.stdout.replace("\\\n", " ").splitlines()  # one line per command
    assert done.returncode == 0, done.stderr
    torch_install = next(line for line in lines if "pip install" in line and " torch" in line)
    assert ".venv-newest/bin/python" in torch_install and "torch==" not in torch_install
    assert any("--upgrade-strategy eager" in line and " triton " in line for line in lines)
    runs = [line for line in lines if "-m pytest" in line]
    assert len(runs) == 2
    assert all(".venv-newest/bin/python" in r and "torch_extensions-newest" in r for r in runs)


def test_class_image_leaves_out_answers_and_the_development_tree():
    """The class image copies the build context whole (`COPY . ...`): .dockerignore must keep solutions, tests
    and local state out of what every learner's server holds, and keep what the image needs to install."""
    assert "COPY --chown=${NB_UID} . " in (ROOT / "instructors/Dockerfile").read_text()
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = {line.strip() for line in lines if line.strip()[:1] not in "#"}
    assert {"solutions", "tests", ".git", ".venv", "submissions", "grades"} <= ignored
    for needed in ("labkernels", "notebooks", "exercises", "pyproject.toml", "setup.py", "README.md"):
        assert not any(Path(needed).match(pattern) for pattern in ignored), needed


def test_every_notebook_stores_the_kernelspec_jupyterlab_will_run():
    """Issue 44: stored as "Python 3", every notebook opened in JupyterLab as modified before anything ran
    (the lab writes the running kernel's spec, "Python 3 (ipykernel)", into the notebook). The browser test
    checks the open itself; this checks every notebook, and that `execute` writes the same spec."""
    from ipykernel.kernelspec import get_kernel_dict

    from labkernels.cli import KERNELSPEC

    assert KERNELSPEC["display_name"] == get_kernel_dict()["display_name"]
    folders = ("notebooks", "notebooks/appendix", "exercises", "solutions")
    paths = [p for folder in folders for p in sorted((ROOT / folder).glob("*.ipynb"))]
    assert len(paths) > 20
    wrong = [
        str(p.relative_to(ROOT))
        for p in paths
        if json.loads(p.read_text())["metadata"].get("kernelspec") != KERNELSPEC
    ]
    assert not wrong, f"stored kernelspec differs from {KERNELSPEC}: {wrong}"
    assert 'nb.metadata["kernelspec"] = dict(KERNELSPEC)' in (ROOT / "labkernels" / "cli.py").read_text()


def test_a_failure_is_logged_as_it_happens(tmp_path, monkeypatch):
    """A GPU job cut off by its time limit printed no tracebacks (pytest prints them at the end): the suite's
    hook writes each failure when it happens, where LABKERNELS_FAILURE_LOG says."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("suite_hooks", ROOT / "tests" / "conftest.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    log = tmp_path / "failures.log"
    monkeypatch.setenv("LABKERNELS_FAILURE_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    passed = SimpleNamespace(failed=False, nodeid="t::ok", when="call", longreprtext="")
    failed = SimpleNamespace(failed=True, nodeid="t::bad", when="call", longreprtext="AssertionError: 1 != 2")
    hooks.pytest_runtest_logreport(passed)
    hooks.pytest_runtest_logreport(failed)
    assert log.read_text() == "=== t::bad (call)\nAssertionError: 1 != 2\n\n"
