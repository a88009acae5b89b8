"""The warm worker pool: worker processes started ahead of a job, with TensorFlow (and
Horovod) already imported, that the next matching job takes instead of starting cold.

- ``kinds``: which jobs a pool serves and the environment that must match;
- ``wire``: one JSON message (with descriptors) per packet on a Unix socket;
- ``keeper``: the daemon that owns one pool's idle processes (one per interpreter
  and kind), hands them out, reports their exits and refills the pool;
- ``idle``: the pooled process itself: imports, waits, then becomes the job's worker;
- ``client``: what the notebook and the supervisor call (ensure, claim, want, list).
"""
