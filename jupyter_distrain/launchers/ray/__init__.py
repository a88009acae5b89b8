"""The Ray launcher: every slot an actor in one placement group (:mod:`.launcher`), the
agent link on each node (:mod:`.node`), the cluster probe (:mod:`.probe`).

How the Ray launcher works
--------------------------

See `launchers.md`. The decisions: the supervisor, not the kernel, is the Ray driver
(the actors belong to it, so a kernel's death changes nothing); the pre-flight runs in
a throw-away process so the kernel never connects to Ray; the slot actors reuse the
ssh launcher's agent (`launchers/agent/`) for the process itself, so stopping, memory and
"kill the tree when cut off" are one implementation; the channels listen on TCP on
the one address the nodes reach (signed and replay-proof), because an ssh-style
socket forward has no Ray equivalent, and Unix sockets would have worked in the test
(namespaces on one machine share the file system) while failing on real nodes.
"""

from .launcher import RayLauncher

__all__ = ["RayLauncher"]
