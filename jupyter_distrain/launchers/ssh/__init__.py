"""The ssh launcher: processes on other hosts over OpenSSH, each one an ssh connection
running the host agent (:mod:`..agent`).

- :mod:`.launcher`: the :class:`SshLauncher` (pre-flight at submit, placement, starts).
- :mod:`.connection`: the agent run on a host over OpenSSH (options, commands, readable
  errors); :mod:`.handles` a process's handle (its own ssh connection, or one of
  mpirun's ranks); :mod:`.lanes` a host's processes over as many connections as sshd's
  session limit needs.
- :mod:`.kept`: the master connection per host kept between jobs; :mod:`.preflight`
  the hosts' checks and what was found; :mod:`.hosts` the ``--hosts`` list;
  :mod:`.pools` the hosts' warm pools for ``%distributed pool``.
- :mod:`.carry`: the job's files to a host; :mod:`.bring_back`: what comes back.
- :mod:`.mpi`: mpirun over ssh and its guard connections.

How to set it up and what it guarantees: ``docs/launchers.md`` ("ssh"); why it is built
this way, with what was measured: its "Decisions" section.
"""

from .launcher import SshLauncher

__all__ = ["SshLauncher"]
