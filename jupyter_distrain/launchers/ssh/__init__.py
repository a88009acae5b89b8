"""The ssh launcher: processes on other hosts over OpenSSH (:mod:`.launcher`), one ssh
session per process (:mod:`.session`), the host list (:mod:`.hosts`).

How the ssh launcher works
--------------------------

How to set it up and what it guarantees is in `launchers.md`; the decisions:

- **An agent per process, not a remote daemon.** Each process is one ssh session
  running `python -m jupyter_distrain.launchers.agent run` (stdlib + psutil, no TensorFlow):
  the process's output flows straight down the session into its log here; the agent
  reports pid + start time, memory and the exit code as marked stderr lines and takes
  `signal`/`ping` lines on stdin (the command words and the report mark are defined
  once, in `agent/host.py`). Both launchers talk to it through one client,
  `agent/client.AgentClient` (reports, pings every 2 s, signals, hang-up, the exit code
  or `EXIT_LOST`), over the ssh session's pipes or, on a Ray node, the agent
  subprocess's; the files a host needs go as one archive (`job_files_archive`). So the
  supervisor's handle (`SshProcess`, Ray's `RayProcess`) has everything the local one
  has, and a session's end is the one signal that kills what it ran: nothing has to be
  found on a host afterwards. The agent reads stdin
  unbuffered (a buffered first `readline` swallowed a stop sent during start-up:
  the stop then took the 12 s fallback; found by the fault test).
- **Channels through ssh, not on the network.** The control and metrics channels
  stay Unix sockets; each session forwards two of them on its host to the
  supervisor's (`-R remote:local`). No listening port, and the per-job signing and
  replay protection are unchanged. Needs sshd's forwarding (on by default).
- **Pre-flight at submit, in the notebook.** Bad hosts fail as a `SpecError` before
  a job directory exists; the hosts' facts (address, interface, free ports, home)
  are stored in `spec.placement`, so the supervisor does not ask again.
- **One master connection per host** (`ControlPersist`, socket in a private runtime
  directory) carries the copy and every session on that host; starts do not wait for
  each other's connection. Measured with 4 processes on 2 hosts
  (launching -> running, 8 alternated pairs): 1.17 s shared, 1.35 s without.
- **Kept between jobs** (`launchers/ssh/kept.py`, `JUPYTER_DISTRAIN_SSH_KEEP`, 300 s):
  the master outlives the job, so a re-run pays no handshake, and the pre-flight's
  findings are remembered while the same master lives, so a re-run checks nothing at
  submit; ports and the leftover sweep moved into the copy (`unpack`), which every job
  does anyway. A warm 2-host re-run went from 2.9 s to 2.1-2.3 s to its first step
  (job written at 0.25 s instead of 0.85 s; copy 0.38 s instead of 0.55 s). Why the
  job's forwards are cancelled at its end: ssh keeps a mux session's `-R` forwards on
  the master after the session ends (measured: sshd kept listening).
- **Horovod's Gloo and host names.** With `HOROVOD_GLOO_IFACE` set right, a 2-host
  job still died connecting to 127.0.0.1: Horovod 0.28's process-set contexts
  (`GlooContext::InitializeForProcessSet`) create their device from a member that is
  never set from the environment, so Gloo falls back to the address the host's name
  resolves to. The test hosts therefore get their own host name and `/etc/hosts`
  (UTS + mount namespaces), as real hosts have, and the pre-flight refuses a
  multi-host Horovod job on a host whose name resolves to loopback.
- **MPI over ssh.** mpirun runs here (as the job's helper) with OpenMPI's rsh agent
  given our ssh options; it hands every rank the same environment, so the job
  directory and the channels' sockets are a template (`~/.../<job>/{hostname}`) that
  the worker completes on its host (`contract.expand_host_paths`), and the hosts'
  directories are named by the hosts' own names (two hosts with one name are
  refused). A guard session per host (the agent's `guard`) forwards the sockets into that
  directory, relays signals to the ranks, remembers the `orted` that started them,
  and kills both when it ends or falls silent (a link set down left `orted` behind
  until then: found by the test). Ranks keep no log file on their host
  (`JUPYTER_DISTRAIN_RANK_OUTPUT=mpirun`); mpirun's `--tag-output` stream is split
  back into each rank's log here (several ranks' chunks may share one line).
- Rows show the host's own name (from the worker's hello) and its address; a failure
  on another host says so ("rank 1 on host jdh2 failed first ...").
- **What comes back from a host is decided here** (`agent/delivery.py`). At the end
  the agent's `send` streams only `result.pkl` and `checkpoints/` (regular files and
  directories); the notebook side reads the archive member by member (never
  `tarfile.extract*`: its `data` filter is bypassable on Python before 3.11.13),
  accepts `result.pkl` only from the host of the rank that produces it
  (`result_slots`) and `checkpoints/` from any, writes each file `O_EXCL|O_NOFOLLOW`
  into a 0700 staging directory opened one level at a time, caps sizes, and moves a
  host's files into place all or none once its archive ended well; only then does the
  agent's `remove` delete the host's directory (else it stays, and the cell says
  where). A refused entry is one warning (`Launcher.warn`, collected into the job's
  warnings by `Supervisor.save`) and never changes the job's outcome. The Ray actor
  streams the same way (`send_open`/`send_read`/`remove`).
"""

from .launcher import SshLauncher

__all__ = ["SshLauncher"]
