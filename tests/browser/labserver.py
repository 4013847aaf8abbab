"""Serve the course with JupyterLab for the browser test: a scratch copy of the pages, a fresh Jupyter home.

The copy keeps the test from writing outputs into the repository (JupyterLab autosaves); the fresh data dir
means no notebook is trusted by an earlier signature, as for a learner on a fresh checkout.
`python tests/browser/labserver.py` serves it by hand and prints the URL (Ctrl-C stops it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Serve pages from another checkout (e.g. freshly executed copies) instead of this one.
SOURCE = Path(os.environ.get("LABKERNELS_BROWSER_SOURCE", ROOT))
PAGES = [
    "README.md",
    "notebooks/00_roofline.ipynb",
    "notebooks/02_strides.ipynb",
    "exercises/00_roofline.ipynb",
]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Debian's Chromium, headless, with nothing fetched from outside (FACTS.md).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Test-only user settings: every cell stays in the page (no windowing), so locators see all outputs.
TEST_SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A running `jupyter lab` over a scratch copy of the course pages."""

    def __init__(self, pages=PAGES, trust: bool = False):
        """`trust`: sign the notebooks for this Jupyter home first, as `make lab` does."""
        self.home = Path(tempfile.mkdtemp(prefix="labkernels-browser-"))
        self.root = self.home / "course"
        for page in pages:
            (self.root / page).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(SOURCE / page, self.root / page)
        settings = self.home / "settings"
        for name, value in TEST_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(value))
        self.port, self.token = _free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            JUPYTER_DATA_DIR=str(self.home / "data"),
            JUPYTER_RUNTIME_DIR=str(self.home / "runtime"),
            JUPYTER_CONFIG_DIR=str(self.home / "config"),
        )
        if trust:
            notebooks = [page for page in pages if page.endswith(".ipynb")]
            subprocess.run([sys.executable, "-m", "jupyter", "trust", *notebooks], cwd=self.root, env=env,
                           check=True, capture_output=True)  # fmt: skip
        cmd = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.home / 'workspaces'}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        ]
        if os.getuid() == 0:
            cmd.append("--allow-root")
        self.log = open(self.home / "lab.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET"):
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: see {self.home / 'lab.log'}")
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"jupyter lab did not answer in {timeout_s} s: see {self.home / 'lab.log'}")

    def shutdown_kernels(self) -> None:
        for kernel in self.api("/api/kernels"):
            self.api(f"/api/kernels/{kernel['id']}", method="DELETE")

    def close(self) -> None:
        try:
            self.shutdown_kernels()
        except OSError:
            pass
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


if __name__ == "__main__":
    lab = Lab()
    print(f"Serving a scratch copy at {lab.url('/lab/tree/README.md')}  (Ctrl-C stops it)", flush=True)
    try:
        lab.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        lab.close()
