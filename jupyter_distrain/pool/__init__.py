"""The warm worker pool: worker processes started ahead of a job, with TensorFlow (and
Horovod) already imported, that the next matching job takes instead of starting cold.

- ``kinds``: which jobs a pool serves and the environment that must match;
- ``wire``: one JSON message (with descriptors) per packet on a Unix socket;
- ``keeper``: the daemon that owns one pool (one per interpreter and kind): its loop
  and socket, over ``stock`` (the idle processes: started, refilled, drained),
  ``claims`` (the claim queue, the hand-over, the claimed processes' exit codes) and
  ``orphans`` (what a claimed process leaves behind); ``settings``: its bounds;
- ``idle``: the pooled process itself: imports, waits, then becomes the job's worker;
- ``client``: what the notebook and the supervisor call (ensure, claim, want, list).

How the pool works, what it guarantees and what was measured: ``docs/pool.md``.
"""
