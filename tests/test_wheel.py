"""The package as users install it: ``python -m build`` makes an sdist and a wheel from
it; the wheel, installed with pip into a new virtualenv where no Node.js can be found,
has the JupyterLab extension prebuilt and enabled (JupyterLab serves its JavaScript),
the server extension enabled and validated, and a cell runs a job."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(argv: list[str], env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return ANSI.sub("", done.stdout + done.stderr)


def test_a_wheel_installs_and_works_where_no_node_exists(tmp_path):
    built = ROOT / "jupyter_distrain/labextension/static"
    assert built.is_dir(), "build the extension first (make builds it before the tests)"
    dist = tmp_path / "dist"
    run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert len(list(dist.glob("jupyter_distrain-*.tar.gz"))) == 1  # the wheel is built from it
    (wheel,) = dist.glob("jupyter_distrain-*.whl")
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", str(venv)], env={})
    bin_dir = venv / "bin"
    # nothing but the new environment's own commands: no node or npm to find
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "PIP_CACHE_DIR": str(Path.home() / ".cache/pip"),
    }
    run([str(bin_dir / "pip"), "install", "-q", str(wheel)], env=env)
    assert not any((bin_dir / tool).exists() for tool in ("node", "npm"))

    listed = run([str(bin_dir / "jupyter"), "labextension", "list"], env=env)
    assert re.search(
        r"jupyter-distrain-labextension v\S+ enabled OK \(python, jupyter_distrain\)", listed
    ), listed
    share = venv / "share/jupyter/labextensions/jupyter-distrain-labextension"
    assert list((share / "static").glob("remoteEntry.*.js")), sorted(share.rglob("*"))
    servers = run([str(bin_dir / "jupyter"), "server", "extension", "list"], env=env)
    assert re.search(
        r"jupyter_distrain enabled\s+- Validating jupyter_distrain\.\.\.\s+jupyter_distrain \S+ OK",
        servers,
    ), servers
    assert serves(bin_dir, share, env, tmp_path)
    cell = "import os\nprint('rank', os.environ['JUPYTER_DISTRAIN_RANK'], 'ran')\n"
    ran = run(
        [
            str(bin_dir / "python"),
            "-c",
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "ip = InteractiveShell.instance()\n"
            "ip.run_line_magic('load_ext', 'jupyter_distrain')\n"
            f"ip.run_cell_magic('distributed', '--workers 2 --backend plain', {cell!r})\n",
        ],
        env=env,
        timeout=120,
    )
    assert "[1] rank 1 ran" in ran and "succeeded" in ran, ran


def serves(bin_dir: Path, share: Path, env: dict[str, str], root: Path) -> bool:
    """JupyterLab, started from that environment, serves the extension's entry point."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (entry,) = (share / "static").glob("remoteEntry.*.js")
    server = subprocess.Popen(
        [
            str(bin_dir / "jupyter"),
            "lab",
            "--no-browser",
            "--allow-root",  # the test may run as root; it serves no one but itself
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.token=wheel-test",
            f"--ServerApp.root_dir={root}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = (
        f"http://127.0.0.1:{port}/lab/extensions/jupyter-distrain-labextension/static/{entry.name}"
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "?token=wheel-test", timeout=5) as response:
                    return response.read() == entry.read_bytes()
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)
        return False
    finally:
        server.terminate()
        server.wait(30)
