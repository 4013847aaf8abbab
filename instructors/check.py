"""Check the class setup as far as a machine without Docker or Kubernetes can: `python instructors/check.py`.

1. The image recipe installs the course exactly as the Makefile does (the lane's torch pin read from
   pyproject.toml, the `course` and lane extras, TORCH_PIP_ARGS for torch alone) and ships the course's
   JupyterLab settings.
2. jupyterhub_config.py loads under both spawners, and (where jupyterhub, dockerspawner and
   jupyterhub-kubespawner are installed) every option it sets is a real option of that class.
3. On Kubernetes, a learner's server starts with the course present: a volume mounted over the course folder
   (empty when new) is first filled with the course by an init container of the same image, which keeps the
   files already there.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


#: pip flags that change how, not what, pip installs: the Makefile skips bytecode (`--no-compile`: written on
#: first import, into a venv the learner owns); the image keeps it (its venv is not the learner's to write).
HOW_FLAGS = ("-q", "--no-cache-dir", "--no-compile")


def install_lines(text: str) -> list[str]:
    """The pip installs of torch and the course, normalised: venv paths and `HOW_FLAGS` dropped."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    found = re.findall(r"pip install ([^\n\\&]+)", code)
    lines = [" ".join(w for w in f.split() if w not in HOW_FLAGS) for f in found]
    return [line for line in lines if "TORCH_PIN" in line or ".[course," in line]


def _unmake(line: str) -> str:
    """A Makefile line with its variables named bare: `$(LANE)` -> `LANE`."""
    return re.sub(r"\$\((\w+)\)", r"\1", line)


def _unshell(line: str) -> str:
    """A Dockerfile line with its variables named bare: `${LANE}` -> `LANE`."""
    return re.sub(r"\$\{(\w+)\}", r"\1", line)


def lane_pin_problems(makefile: str, dockerfile: str) -> list[str]:
    """Both read torch's pin from the lane's extra in pyproject.toml, and the extras pin torch and triton."""
    import tomllib

    problems = []
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for lane in ("cpu", "gpu"):
        pins = extras.get(f"{lane}-lane", [])
        if not (pins and pins[0].startswith("torch==") and any(p.startswith("triton==") for p in pins[1:])):
            problems.append(f"pyproject.toml: {lane}-lane must pin torch first, then triton: {pins}")
    for name, text in (("Makefile", makefile), ("Dockerfile", dockerfile)):
        if "-lane = " not in text or "TORCH_PIN" not in text:
            problems.append(f"{name}: torch's pin is not read from pyproject.toml's lane extra")
    return problems


def check_image() -> list[str]:
    problems = []
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    dockerfile = (HERE / "Dockerfile").read_text()
    want = [_unmake(line) for line in install_lines(recipe)]
    got = [_unshell(line) for line in install_lines(dockerfile)]
    if not want:
        problems.append("Makefile: no torch / course install found in $(VENV)/.installed")
    if want != got:
        problems.append(f"Dockerfile installs {got}, the Makefile {want}")
    problems += lane_pin_problems(makefile, dockerfile)
    if "labkernels/jupyter/overrides.json" not in dockerfile:
        problems.append("Dockerfile does not install labkernels/jupyter/overrides.json")
    return problems


def load_config(spawner: str):
    from traitlets.config import Config

    os.environ["LABKERNELS_SPAWNER"] = spawner
    config = Config()
    namespace = {"get_config": lambda: config, "__file__": str(HERE / "jupyterhub_config.py")}
    exec(compile((HERE / "jupyterhub_config.py").read_text(), "jupyterhub_config.py", "exec"), namespace)
    return config


def check_config() -> list[str]:
    problems = []
    classes = {}
    try:
        from dockerspawner import DockerSpawner
        from jupyterhub.app import JupyterHub
        from jupyterhub.spawner import Spawner
        from kubespawner import KubeSpawner

        classes = {
            "JupyterHub": JupyterHub,
            "Spawner": Spawner,
            "DockerSpawner": DockerSpawner,
            "KubeSpawner": KubeSpawner,
        }
    except ImportError as e:
        print(f"(options not checked against the classes: {e.name} is not installed)")
    for spawner in ("docker", "kubernetes"):
        config = load_config(spawner)
        for section, options in config.items():
            cls = classes.get(section)
            for name in options if cls else ():
                if not cls.class_traits().get(name):
                    problems.append(f"{spawner}: {section}.{name} is not an option of {cls.__name__}")
        print(
            f"jupyterhub_config.py loads with LABKERNELS_SPAWNER={spawner}: {config.JupyterHub.spawner_class}"
        )
    return problems


def course_volume_problems(config, course_dir: str = "/home/jovyan/course") -> list[str]:
    """Kubernetes: for each profile, a volume mounted over `course_dir` must be filled first by an init
    container of the profile's image that copies `course_dir` into it without replacing files (`cp -n`)."""
    base = config.KubeSpawner
    problems = []
    for profile in base.get("profile_list", []):
        spawner = {**base, **profile.get("kubespawner_override", {})}
        name = profile.get("display_name")
        for mount in spawner.get("volume_mounts", []):
            if mount["mountPath"].rstrip("/") != course_dir:
                continue
            fills = [
                init
                for init in spawner.get("init_containers", [])
                if init.get("image") == spawner.get("image")
                and any(m["name"] == mount["name"] for m in init.get("volumeMounts", []))
                and re.search(rf"cp -a -n {re.escape(course_dir)}/\. ", " ".join(init.get("command", [])))
            ]
            if not fills:
                problems.append(
                    f"{name}: volume {mount['name']!r} is mounted over {course_dir}, and no init container "
                    f"of the image {spawner.get('image')} copies the course into it first: a new learner's "
                    "server would start without the course"
                )
    return problems


def check_kubernetes() -> list[str]:
    return course_volume_problems(load_config("kubernetes"))


if __name__ == "__main__":
    problems = check_image() + check_config() + check_kubernetes()
    for p in problems:
        print("PROBLEM:", p)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)
