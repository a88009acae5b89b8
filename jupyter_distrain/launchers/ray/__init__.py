"""The Ray launcher: every slot an actor in one placement group (:mod:`.launcher`), the
agent link on each node (:mod:`.node`), the cluster probe (:mod:`.probe`)."""

from .launcher import RayLauncher

__all__ = ["RayLauncher"]
