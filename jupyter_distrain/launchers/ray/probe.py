"""The Ray launcher's pre-flight, run at submit in a process of its own (so the notebook's
kernel never becomes a Ray driver, and a cluster that does not answer is cut off at
``--timeout`` with nothing left running):
``python -m jupyter_distrain.launchers.ray.probe ADDRESS``.

Prints one JSON line: ``{"address": the GCS address connected to ("" when there is
no running Ray and the job will start a local one), "nodes": [{"address",
"resources"}, ...]}`` (alive nodes and their total resources), or
``{"error": "..."}``.

What it found is remembered in the user's private runtime directory
(:func:`remember_probe`), so a re-run on the same cluster soon after does not start a
Ray driver at submit again: :func:`recall_probe` gives it back while it is recent and
the cluster's GCS still answers at its address.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

QUIET = {"RAY_USAGE_STATS_ENABLED": "0"}  # a pre-flight is not usage
CONNECT_SECONDS = 5.0


def import_ray() -> Any:
    """``ray``, imported without jsonschema's optional IRI format check: its
    ``rfc3987_syntax`` (installed with Jupyter's ``jsonschema[format-nongpl]``) builds a
    grammar when imported, 1.3 s of the 2 s ``import ray`` took on 2 cores. Nothing of
    Ray's checks formats; the module may still be imported later by whoever wants it."""
    if "ray" not in sys.modules and "rfc3987_syntax" not in sys.modules:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
        try:
            import ray
        finally:
            if sys.modules.get("rfc3987_syntax", ...) is None:
                del sys.modules["rfc3987_syntax"]
    import ray

    return ray


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port`` GCS address; None for other forms."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in host:
        return None
    return host.strip("[]"), int(port)


def answers(address: str) -> str | None:
    """Why nothing answers at a ``host:port`` address, or None when something does."""
    parts = split_address(address)
    if parts is None:
        return None  # ray://, "auto": Ray itself says
    try:
        with socket.create_connection(parts, CONNECT_SECONDS):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def connect_driver(address: str) -> str | None:
    """Make this process a driver of the cluster at ``address`` ("": a running one);
    why not, or None. "" when there is no running Ray and no address was given."""
    if address:
        why = answers(address)
        if why:
            return f"no Ray cluster answers at {address} ({why})"
    ray = import_ray()
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    try:
        ray.init(
            address=address or "auto",
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    except ConnectionError as exc:
        return f"cannot connect to the Ray cluster at {address}: {exc}" if address else ""
    except Exception as exc:  # Ray's own refusals (versions, raylets): say what it said
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot connect to the Ray cluster at {address or 'auto'}: {first}"
    return None


def probe(address: str) -> dict[str, Any]:
    """What the launcher needs to know about the cluster at ``address``."""
    why = connect_driver(address)
    if why == "":
        return {"address": "", "nodes": []}
    if why:
        return {"error": why}
    ray = import_ray()
    try:
        nodes = [
            {"address": n["NodeManagerAddress"], "resources": n["Resources"]}
            for n in ray.nodes()
            if n.get("Alive")
        ]
        gcs = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    return {"address": gcs, "nodes": nodes}


def run_driver(module: str, args: list[str], python: str, timeout: float) -> dict[str, Any]:
    """Run ``python -m module args`` (a Ray driver of its own, so the notebook's kernel
    never becomes one) and return the JSON object it printed last; :class:`TimeoutError`
    (its process group killed) past ``timeout``, :class:`RuntimeError` (its last line of
    stderr) when it printed none."""
    with subprocess.Popen(
        [python, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **QUIET},
        start_new_session=True,
    ) as driver:
        try:
            out, err = driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
            driver.communicate()
            raise TimeoutError(f"no answer within {timeout:g} s") from None
    try:
        found = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        said = err.decode(errors="replace").strip().splitlines()[-1:] or ["no answer"]
        raise RuntimeError(said[0])
    return found


def _remembered_path(key: str) -> Path:
    from ...contract.private import runtime_dir

    return runtime_dir() / f"ray-probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def remember_probe(key: str, found: dict[str, Any]) -> None:
    """Keep what a probe ``found`` (a cluster that answered) for ``key``."""
    from ...contract.private import write_atomic

    write_atomic(_remembered_path(key), json.dumps({"at": time.time(), "found": found}))


def recall_probe(key: str, seconds: float) -> dict[str, Any] | None:
    """What a probe found for ``key`` in the last ``seconds``, if its cluster's GCS still
    answers (a connection, no Ray driver)."""
    try:
        remembered = json.loads(_remembered_path(key).read_text())
        found, at = remembered["found"], float(remembered["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= time.time() - at <= seconds or not isinstance(found, dict):
        return None
    if not found.get("address") or answers(found["address"]) is not None:
        return None
    return found


def main(argv: list[str]) -> int:
    address = argv[0] if argv else ""
    print(json.dumps(probe(address)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
