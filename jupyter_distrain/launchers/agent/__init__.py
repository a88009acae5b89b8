"""The host agent: the small program the ssh and Ray launchers run beside each process on
a host (:mod:`.host`, run as ``python -m jupyter_distrain.launchers.agent CMD``)."""
