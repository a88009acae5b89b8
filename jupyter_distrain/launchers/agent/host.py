"""The host agent: ``python -m jupyter_distrain.launchers.agent CMD``, the program every
remote launcher runs on a host (an ssh connection's command, a Slurm task's child, a Ray
actor's subprocess): it describes the host, runs and guards the job's processes and
relays their reports. The job's directory on the host (unpacked, packed, removed) is
:mod:`.files`, which the Slurm task and the Ray actor use as well.

Light to import (no TensorFlow, no ZeroMQ). Its commands:

- ``preflight``: can this host run the job? Prints one JSON line: this package's
  version and the agent's :data:`PROTOCOL` (the launcher refuses another), the
  interpreter, whether the backend's libraries are there, the address the ssh
  connection came in on (``SSH_CONNECTION``), the interface holding it, and free TCP
  ports on it.
- ``unpack DIR [--owner ID] [--leftovers] [--address A --ports N]``: make the job's
  private directory (0700), mark it as notebook ``ID``'s (:data:`.files.OWNER`) and extract
  the tar read from stdin into it (the spec, ``train.py``, pushed values, the control
  file). With ``--leftovers`` the tar comes after one line ``{"notebook": ID, "live":
  [JOB, ...]}``, and this host's directories of that notebook's jobs not named live
  (what a rebooted notebook or a killed supervisor left) are removed first. Prints one
  JSON line: ``N`` free TCP ports on ``A`` (the job's, fresh at each start) and the
  jobs ``removed``.
- ``run DIR``: start one process (its argv, environment and working directory come as
  the first JSON line on stdin) with its output on this session's stdout; report its
  pid and start time, its memory and finally its exit code as marked lines on stderr;
  take ``signal`` and ``ping`` commands from stdin. The first session of a job's
  generation on a host carries the job's files (``files`` in the request: the sweep's
  claims and the tar's size, the tar right after the line) and unpacks them as
  ``unpack`` would, then marks the directory (:data:`.files.UNPACKED`); the host's other
  sessions of that generation wait for the mark (``wait_files``). So a host costs one
  round trip, not two; a job whose backend needs the host's free ports first, or
  mpirun's guards, still unpacks before. A worker the request asks to take
  from the pool (``pool``) is claimed from this host's warm pool when it has one
  ready (:mod:`.pooled`). When stdin ends (the connection
  or the supervisor is gone) or no ``ping`` came for ``HEARTBEAT_TIMEOUT`` seconds,
  the whole process tree is killed: nothing outlives its connection.
- ``guard DIR``: hold the host while processes that another program started (mpirun's
  ranks) run there for the job; when the session ends or falls silent, kill them.
- ``send DIR``: stream a tar of what the job produced there that comes back
  (:data:`.files.RETURNED`: its result, its checkpoints; regular files and directories only)
  to stdout, as it is read; the directory stays.
- ``pools [--drain]``: this host's warm pools as a JSON list (:mod:`.pooled`), after
  asking them to end their idle processes with ``--drain``.
- ``remove DIR``: remove the job's directory here (once the notebook side has stored
  what ``send`` sent), and its forwarded sockets. ``finish DIR`` is both, as older
  launchers ask.

The sockets ssh forwards for a process (``-R``) are in one private directory per host
(:func:`.files.sockets_dir`), made by the pre-flight and kept between jobs: sshd makes them
when the session opens, before the agent has unpacked the job's directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from ... import processes
from ...contract.handoff import memory_file
from ...contract.process import Env
from ...version import __version__
from .files import (
    JOBS_ROOT,
    UNPACKED,
    cells_in_memory,
    forget_cells,
    make_private_dir,
    own_sockets_dir,
    owner_of,
    pack,
    remove,
    unpack,
    write_cell_file,
    write_private,
)

# What the launcher and this agent must agree on: raised with every change to the
# commands, their arguments or their answers (the pre-flight refuses another).
PROTOCOL = 7
MARK = "\x1ejupyter_distrain "  # starts every line the agent writes to stderr
# The command lines the launcher sends on stdin (:class:`.client.AgentClient`): ``ping``
# (any line counts as one), ``signal SIG TREE`` (``run``), ``kill PID SIG`` (``guard``),
# ``file NAME BASE64`` (``run``, ``guard``: a session's cell for the job's directory here).
PING, SIGNAL, KILL, FILE = "ping", "signal", "kill", "file"
HEARTBEAT_TIMEOUT = 10.0  # seconds without a ping before the agent kills its process
REPORT_SECONDS = 2.0  # how often memory is reported
SOCKET_WAIT = 10.0  # seconds to wait for ssh's forwarded sockets to appear
FILES_WAIT = 60.0  # seconds a session waits for the one carrying the job's files


def report(**fields: Any) -> None:
    """One marked JSON line on stderr, for the launcher on the other end."""
    sys.stderr.write(MARK + json.dumps(fields) + "\n")
    sys.stderr.flush()


# --- preflight ------------------------------------------------------------------------
def interface_of(address: str) -> str:
    """The network interface that holds ``address`` here ("" when none does)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addresses):
            return name
    return ""


def _address_of(interface: str) -> str:
    import psutil

    for a in psutil.net_if_addrs().get(interface, []):
        if a.family == socket.AF_INET:
            return a.address
    return ""


def route_source(host: str) -> str:
    """This machine's address on the way to ``host`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((socket.gethostbyname(host), 9))
        return sock.getsockname()[0]


def free_ports(address: str, count: int) -> list[int]:
    """``count`` distinct free TCP ports on ``address``."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((address, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def describe(address: str, ports: int = 0) -> dict[str, Any]:
    """This host as a Slurm task or a Ray slot tells its launcher: the address the job
    uses here, the interface holding it, the host's name, this package's version and the
    agent's protocol (the launcher refuses another), and ``ports`` free ports there."""
    return {
        "address": address,
        "iface": interface_of(address) or "lo",
        "hostname": socket.gethostname(),
        "version": __version__,
        "protocol": PROTOCOL,
        "ports": free_ports(address, ports) if ports else [],
    }


def preflight(backend: str, interface: str, ports: int) -> dict[str, Any]:
    """What the launcher needs to know about this host (see the module docstring)."""
    from ...plugins import BACKENDS, load_plugin

    found: dict[str, Any] = {"version": __version__, "protocol": PROTOCOL}
    found["python"], found["home"] = sys.executable, str(Path.home())
    try:
        chosen = load_plugin(BACKENDS, backend)
        ok, why = chosen.available()
        found["framework_version"] = chosen.framework_version() if ok else None
    except Exception as exc:  # a broken install: say so rather than crash
        ok, why = False, f"{type(exc).__name__}: {exc}"
    found["backend_ok"], found["backend_why"] = ok, why
    client, _, server = (os.environ.get("SSH_CONNECTION", "").split() + ["", "", ""])[:3]
    found["driver"] = client
    found["name"] = socket.gethostname()
    try:  # Horovod's Gloo binds some of its contexts to the address the host name has
        found["name_address"] = socket.gethostbyname(found["name"])
    except OSError:
        found["name_address"] = ""
    if interface:
        found["iface"], found["address"] = interface, _address_of(interface)
    else:
        found["iface"], found["address"] = interface_of(server), server
    if found["address"]:
        found["ports"] = free_ports(found["address"], ports)
        found["network"] = _network_of(found["iface"], found["address"])
    found["orted"] = shutil.which("orted") or ""  # OpenMPI's daemon, for --controller mpi
    make_private_dir(own_sockets_dir())  # where the job's sessions forward their sockets
    return found


def _network_of(interface: str, address: str) -> str:
    """``address``'s network on ``interface`` in CIDR notation (OpenMPI's if_include)."""
    import ipaddress

    import psutil

    for a in psutil.net_if_addrs().get(interface, []):
        if a.family == socket.AF_INET and a.address == address and a.netmask:
            return str(ipaddress.ip_interface(f"{address}/{a.netmask}").network)
    return f"{address}/32"


def remove_leftovers(notebook: str, live: set[str]) -> list[str]:
    """Remove this host's directories of ``notebook``'s jobs other than ``live`` (and
    whatever of those jobs still runs here); the job ids removed. Directories of other
    notebooks, of other hosts sharing this home, or with no owner are left alone."""
    root = Path.home() / JOBS_ROOT
    hostname = socket.gethostname()
    try:
        jobs = sorted(root.iterdir())
    except OSError:
        return []
    removed = []
    for job in jobs:
        directory = job / hostname
        if job.name in live or job.is_symlink() or owner_of(directory) != notebook:
            continue
        kill_job_processes(directory)
        remove(directory)
        removed.append(job.name)
    return removed


# --- running one process ------------------------------------------------------------------
class Running(Protocol):
    """What ``run`` runs: a ``Popen`` it started, or a pooled process (the keeper's
    child, not below this agent)."""

    pid: int

    def poll(self) -> int | None: ...


def _kill_all(process: Running) -> None:
    """Kill the process and everything below this agent (orphans come to us: subreaper);
    a pooled process's tree explicitly, since it is not below us."""
    import psutil

    if not isinstance(process, subprocess.Popen):
        with contextlib.suppress(psutil.Error):
            processes.signal_tree(psutil.Process(process.pid), signal.SIGKILL)
    processes.kill_descendants()
    deadline = time.monotonic() + 0.5
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    for member in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
            member.wait(0.5)


def _signal(process: Running, sig: int, tree: bool) -> None:
    import psutil

    with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
        if tree:
            processes.signal_tree(psutil.Process(process.pid), sig)
        else:
            os.kill(process.pid, sig)


def _wait_for_sockets(paths: list[str]) -> None:
    deadline = time.monotonic() + SOCKET_WAIT
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.02)


class CommandReader:
    """Lines from a file descriptor, read unbuffered (a buffered reader would hide lines
    it read ahead from ``select``)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pending = b""
        self.closed = False

    def fill(self) -> None:
        """Read what is there (call when ``select`` says so); an empty read means EOF."""
        chunk = os.read(self.fd, 65536)
        self.closed = not chunk
        self.pending += chunk

    def lines(self) -> list[bytes]:
        """The complete lines read so far."""
        *complete, self.pending = self.pending.split(b"\n")
        return complete

    def first_line(self) -> bytes:
        while b"\n" not in self.pending and not self.closed:
            self.fill()
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def exactly(self, count: int) -> bytes:
        """The next ``count`` bytes (what came after a request line); raises ``EOFError``
        when the stream ends before."""
        parts, have = [self.pending], len(self.pending)
        while have < count:
            chunk = os.read(self.fd, max(65536, count - have))
            if not chunk:
                self.closed = True
                raise EOFError(f"the stream ended {count - have} bytes short")
            parts.append(chunk)
            have += len(chunk)
        joined = b"".join(parts)
        self.pending = joined[count:]
        return joined[:count]


def run(directory: Path) -> int:
    """Run the process described on stdin's first line until it exits or we are cut off:
    taken from this host's warm pool when the request asks for one and it has one
    ready, else started here."""
    import psutil

    from .pooled import from_pool, pool_for

    commands = CommandReader(sys.stdin.fileno())
    request = json.loads(commands.first_line())
    generation = str(request.get("run", ""))
    if "files" in request:
        _unpack_carried(directory, request["files"], commands, generation)
    elif request.get("wait_files") and not _files_came(directory, generation, commands):
        sys.stderr.write(f"the job's files did not come within {FILES_WAIT:g} s\n")
        return 1
    env = {**os.environ, **request["env"]}
    # its keeper is not ours to sweep: before this
    pool_socket = pool_for(request, env, Path.home() / JOBS_ROOT)
    processes.become_subreaper()
    _wait_for_sockets(request.get("sockets", []))
    os.chdir(directory)
    # where the secret and pushed values are handed in memory (Ray, Slurm), a session's
    # later cells' are kept in memory too
    memory = cells_in_memory(directory) if "handoff" in request else None
    pooled = from_pool(pool_socket, request, env, directory) if pool_socket else None
    process = pooled[0] if pooled else _start(request, env)
    try:
        create_time = psutil.Process(process.pid).create_time()
        report(pid=process.pid, create_time=create_time, pooled=pooled is not None)
        return _serve(process, commands, directory)
    except OSError:  # the connection is gone (a write to it failed)
        _kill_all(process)
        return 1
    finally:
        forget_cells(directory, memory)
        if pooled and pooled[1] is not None:
            pooled[1].close()


def _unpack_carried(
    directory: Path, files: dict[str, Any], commands: CommandReader, generation: str
) -> None:
    """The job's files that came after the request: the sweep first (as ``unpack
    --leftovers``), then the tar, then the mark the host's other sessions wait for."""
    data = commands.exactly(int(files["bytes"]))
    removed = _sweep(files.get("claims") or {})
    unpack(directory, data, str(files.get("owner", "")))
    write_private(directory / UNPACKED, generation)
    if removed:
        report(removed=removed)


def _files_came(directory: Path, generation: str, commands: CommandReader) -> bool:
    """Wait for the session carrying ``generation``'s files to have unpacked them here;
    whether it did within :data:`FILES_WAIT` (and before the launcher hung up)."""
    deadline = time.monotonic() + FILES_WAIT
    while time.monotonic() < deadline and not commands.closed:
        with contextlib.suppress(OSError):
            if (directory / UNPACKED).read_text() == generation:
                return True
        if select.select([commands.fd], [], [], 0.01)[0]:
            commands.fill()  # its pings wait in the buffer; an end of stream ends the wait
    return False


def _start(request: dict[str, Any], env: dict[str, str]) -> subprocess.Popen[bytes]:
    cpus = request.get("cpus")
    handed: tuple[int, ...] = ()
    if "handoff" in request:  # the secret and pushed values, in memory (contract/handoff.py)
        handed = (memory_file(request["handoff"]),)
        env[Env.HANDOFF_FD] = str(handed[0])

    def preexec() -> None:
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)

    process = subprocess.Popen(
        request["argv"],
        stdin=subprocess.DEVNULL,
        stdout=sys.stdout.fileno(),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,
        pass_fds=handed,
    )
    for fd in handed:
        os.close(fd)
    return process


def _serve(process: Running, commands: CommandReader, directory: Path) -> int:
    """Relay commands and reports until the process exits; kill it when cut off."""
    heard = reported = time.monotonic()
    code: int | None = None
    oom = processes.OomCounter.of(process.pid)
    killed = False  # a SIGKILL came from the launcher: not the OOM killer's
    while code is None:
        for line in commands.lines():
            words = line.split()
            if words[:1] == [SIGNAL.encode()] and len(words) == 3:
                killed = killed or int(words[1]) == signal.SIGKILL
                _signal(process, int(words[1]), words[2] == b"1")
            elif words[:1] == [FILE.encode()] and len(words) == 3:
                write_cell_file(directory, words[1].decode(errors="replace"), words[2].decode())
        if commands.closed:  # the connection or the launcher is gone
            _kill_all(process)
            return 1
        readable, _, _ = select.select([commands.fd], [], [], 0.2)
        if readable:
            commands.fill()
            heard = time.monotonic()
        now = time.monotonic()
        if now - heard > HEARTBEAT_TIMEOUT:
            _kill_all(process)
            report(lost=f"nothing heard from the launcher for {HEARTBEAT_TIMEOUT:g} s")
            return 1
        if now - reported >= REPORT_SECONDS:
            reported = now
            report(rss=processes.tree_rss(process.pid))
        code = process.poll()
    _kill_all(process)  # what it left behind (orphans come to us: subreaper)
    report(exit=code, oom=code == -signal.SIGKILL and not killed and bool(oom and oom.struck()))
    return 0


def guard(directory: Path) -> int:
    """Hold a host for the processes that others start here (mpirun's ranks): when this
    session ends or falls silent, kill every process of this user whose job directory
    is ``directory``."""
    commands = CommandReader(sys.stdin.fileno())
    heard = time.monotonic()
    starters: dict[int, float] = {}  # the processes that started the job's (OpenMPI's orted)
    while not commands.closed and time.monotonic() - heard < HEARTBEAT_TIMEOUT:
        readable, _, _ = select.select([commands.fd], [], [], 0.5)
        if readable:
            commands.fill()
            heard = time.monotonic()
        for line in commands.lines():
            words = line.split()
            if words[:1] == [KILL.encode()] and len(words) == 3:
                signal_job_process(directory, int(words[1]), int(words[2]))
            elif words[:1] == [FILE.encode()] and len(words) == 3:
                write_cell_file(directory, words[1].decode(errors="replace"), words[2].decode())
        starters.update(_starters_of(directory))
    killed = kill_job_processes(directory) + processes.kill_same(starters)
    with contextlib.suppress(OSError):
        report(guard_killed=killed)
    return 0


def _of_job(proc: Any, directory: Path) -> bool:
    """Whether ``proc`` is one of this user's processes of the job in ``directory``."""
    from ...contract.process import Env, expand_host_path

    if proc.pid == os.getpid() or proc.uids().real != os.getuid():
        return False
    given = proc.environ().get(Env.JOB_DIR, "")
    return bool(given) and str(directory) in (given, expand_host_path(given))


def _starters_of(directory: Path) -> dict[int, float]:
    """The parents (pid: start time) of the job's processes here, other than this
    user's shells: the daemons that started them, which outlive them."""
    import psutil

    found = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _of_job(proc, directory):
                parent = proc.parent()
                if parent is not None and parent.name() == "orted":
                    found[parent.pid] = parent.create_time()
    return found


def kill_job_processes(directory: Path) -> list[int]:
    """Kill the processes of the job in ``directory`` here; returns their pids."""
    import psutil

    killed = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _of_job(proc, directory):
                proc.kill()
                killed.append(proc.pid)
    return killed


def signal_job_process(directory: Path, pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it is a process of the job in ``directory``."""
    import psutil

    with contextlib.suppress(psutil.Error, ValueError):
        proc = psutil.Process(pid)
        if _of_job(proc, directory):
            proc.send_signal(sig)


def _sweep(claims: dict[str, Any]) -> list[str]:
    """:func:`remove_leftovers` as ``claims`` (``{"notebook": ID, "live": [JOB, ...]}``)
    say; the jobs removed."""
    if not claims.get("notebook"):
        return []
    return remove_leftovers(str(claims["notebook"]), set(map(str, claims.get("live", []))))


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m jupyter_distrain.launchers.agent")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("preflight")
    check.add_argument("--backend", required=True)
    check.add_argument("--interface", default="")
    check.add_argument("--ports", type=int, default=0)
    commands.add_parser("pools").add_argument("--drain", action="store_true")
    for name in ("unpack", "run", "guard", "send", "remove"):
        command = commands.add_parser(name)
        command.add_argument("directory")
        if name == "unpack":
            command.add_argument("--owner", default="")
            command.add_argument("--address", default="")
            command.add_argument("--ports", type=int, default=0)
            command.add_argument("--leftovers", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "preflight":
        print(json.dumps(preflight(args.backend, args.interface, args.ports)), flush=True)
        return 0
    if args.command == "pools":
        from .pooled import pools

        print(json.dumps(pools(args.drain, Path.home() / JOBS_ROOT)), flush=True)
        return 0
    directory = Path(args.directory).expanduser()
    if args.command == "unpack":
        removed = _sweep(json.loads(sys.stdin.buffer.readline() or b"{}")) if args.leftovers else []
        make_private_dir(own_sockets_dir())  # in case it went since the pre-flight
        unpack(directory, sys.stdin.buffer.read(), args.owner)
        ports = free_ports(args.address, args.ports) if args.address else []
        print(json.dumps({"ports": ports, "removed": removed}), flush=True)
        return 0
    if args.command == "run":
        return run(directory)
    if args.command == "guard":
        return guard(directory)
    if args.command == "send":
        pack(directory, sys.stdout.buffer)
        sys.stdout.flush()
    if args.command == "remove":
        remove(directory)
    return 0
