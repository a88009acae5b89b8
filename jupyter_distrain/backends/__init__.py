"""Backends turn placed slots into processes (argv + env) and driver-side services.

How the backends work
---------------------

- horovod/gloo: N workers, rendezvous server in the supervisor. Ends: all exit 0 (success)
  or one exits non-zero (failure, others stopped).
- horovod/mpi: one `mpirun` hosting N ranks (each rank still has a row, pid and log). Ends:
  the same, ranks reporting their exit with `bye`.
- tf: N workers with TF_CONFIG. Ends: the same.
- ps (strategy): chief + N workers + P ps, TF_CONFIG each; workers and ps only run
  `tf.distribute.Server`. Ends: the chief exits (its code decides); a ps exiting fails the
  job at once; a worker lost is recorded (`process_lost`) and TensorFlow's coordinator
  carries on.
- ps (seed): N workers + P ps; ps join, workers call the cell's `run(cluster, server,
  task_index)` in TF1 graph mode; a non-chief worker whose `run` returned keeps serving (the
  chief's session may still need it); no gRPC fail-fast, so the chief's session waits for
  servers still starting. Ends: worker 0 (the chief) exits; the rest are stopped after
  `--grace` (sync workers block forever otherwise).
- torch: N workers with torchrun's environment (`MASTER_ADDR` = rank 0's slot address,
  `MASTER_PORT` reserved there). Ends: as horovod/gloo.
- jax: N processes with `JAX_COORDINATOR_ADDRESS` (rank 0's slot address, a port reserved
  there, bound there too), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` and Keras's
  `KERAS_DISTRIBUTION_*`. Ends: as horovod/gloo.
- mpi: one `mpirun` hosting N ranks, as horovod/mpi, without Horovod's variables. Ends: as
  horovod/mpi.
- plain: N independent copies. Ends: all have ended; failed if any failed that was not
  stopped on request.

These rules live in each backend's `outcome()`; the supervisor only asks it
after every exit. Ports for TF servers come from the launcher
(`reserve_ports`: bound, read, released together, so they are distinct and
free at that moment). Seed mode is chosen by the cell's AST: a top-level
`def run(cluster, server, task_index)`.

**JAX (`backends/jax.py`, `worker/jax_hook.py`).** JAX reads only the coordinator's
address from the environment; the count and id come from the first of its "cluster
environments" (`jax._src.clusters.ClusterEnv` subclasses: Slurm, Open MPI, ...) that
says it is present. The worker bootstrap registers one, first in the list, when the
program imports JAX, reading the variables the backend set; so
`jax.distributed.initialize()` needs no arguments, and Keras's
`keras.distribution.initialize()` reads its own `KERAS_DISTRIBUTION_*`. JAX's CPU
collectives (Gloo) are made with no interface by default and then bind what the host
name resolves to (loopback on the test hosts): the bootstrap wraps
`make_gloo_tcp_collectives` to pass the slot's interface. The coordinator's bind
address is set to the slot's (JAX's default is `[::]`). Keras 3's `fit` (the JAX
trainer) gets the same callbacks as tf-keras's; its backup on a scale request is
Keras 3's `BackupAndRestore._save_model`, called on every process because reading
distributed weights is a collective (rank 0 alone hung in it), each into its own
directory, and the request is agreed with an all-gather of the flag. JAX's
preemption service is off (`JAX_ENABLE_PREEMPTION_SERVICE=false`, unless `--env`
says otherwise): it catches SIGTERM as a preemption notice, so each process ignored
a stop's or a failure's SIGTERM and lived until the SIGKILL a grace later.

**PyTorch (`backends/torch.py`, `worker/torch_hook.py`, `torch.py`).** The backend
gives each rank the variables `torchrun` sets rather than a helper to call, so a
script written for `torchrun` needs no change and `init_process_group()` no
arguments; `MASTER_ADDR` is always an address (a host name may resolve to loopback
on the host itself). `OMP_NUM_THREADS=1` where a host runs several ranks, as
torchrun does: without it two ranks of two threads on two cores ran at 0.30x
torchrun's steps/sec. The widget's steps come from torch's global optimizer
step-post hook (the first optimizer that steps counts, so a second optimizer does
not double the steps) and the images from the last batch a `DataLoader` iterator
yielded; the hook goes quiet once the program calls `report()` itself, and inside
`torch.distributed.checkpoint`'s own state-making optimizer steps (they showed up as
steps 1 and 2 of every resumed rank). `checkpointed()` makes scaling work the
Keras way (SIGUSR1, save, `CHECKPOINT_EXIT`, restart at the new size), but the
ranks first agree with one MAX allreduce of a 0/1 flag per step on whether to save,
since the signal reaches them at different steps and a DCP save is a collective;
the state is `get_state_dict(model, optimizer)`, so FSDP2's sharded tensors are saved
as shards and re-cut for the new world size at load.

Two torch findings shape the worker. The torch pool kind pre-imports `torch._dynamo`,
because `DistributedDataParallel`'s constructor imports it: 1.5 s of a pooled
re-run's 1.9 s to its first step went there (with it, 0.40 s). And the worker sleeps
0.1 s (`torch_hook.settle()`) after the program and before its namespace is freed,
whenever `torch.distributed` was imported. Each work started in a backward pass
holds a Python object: torch 2.13 keeps the autograd context in the thread-local
state that the work copies. So the Gloo thread that ran the work needs the GIL to
let go of it. Freeing the program's DDP model frees its process group, whose
destructor joins those threads while holding the GIL. If one of them is still
waiting for the GIL, neither ever moves. 4 of 10 pooled runs of the launch
benchmark's program hung so (`py-spy dump --native`: `~Reducer` -> `~ProcessGroupGloo`
-> `thread::join` on the main thread, `~AsyncAllreduceWork` -> `gil_scoped_acquire`
on `pt_gloo_runloop`); 0 of 12 after the fix. Why pooled ranks that pre-imported
`torch._dynamo` hit the race so often was not found: without that import 0 of 8
pooled runs hung, and under `torchrun` 0 of 10 hung with or without it.
"""
