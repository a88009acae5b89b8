"""The ssh launcher: processes on other hosts over OpenSSH (:mod:`.launcher`), one ssh
session per process (:mod:`.session`), the host list (:mod:`.hosts`)."""

from .launcher import SshLauncher

__all__ = ["SshLauncher"]
