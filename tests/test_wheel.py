"""The package as users install it: a wheel built from this repository, installed with
pip into a new virtualenv where no Node.js can be found, has the JupyterLab extension
prebuilt and enabled, the server extension enabled and validated, and the magic."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(argv: list[str], env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return ANSI.sub("", done.stdout + done.stderr)


def test_a_wheel_installs_and_works_where_no_node_exists(tmp_path):
    wheels = tmp_path / "wheels"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(Path.home())},
    )
    (wheel,) = wheels.glob("jupyter_distrain-*.whl")
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
    magic = run(
        [
            str(bin_dir / "python"),
            "-c",
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "ip = InteractiveShell.instance()\n"
            "ip.run_line_magic('load_ext', 'jupyter_distrain')\n"
            "print(sorted(ip.magics_manager.magics['cell']))\n",
        ],
        env=env,
    )
    assert "'distributed'" in magic, magic
