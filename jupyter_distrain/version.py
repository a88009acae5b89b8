"""The package's version: a leaf module, so that the modules that report it (the host
agent, the Ray node, the Slurm task, the pool's kind) need not import the package's
public face."""

__version__ = "0.1.0"
