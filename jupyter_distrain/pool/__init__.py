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

How the pool works
------------------

A notebook user re-runs the same cell many times; a cold worker spends ~2.3 s
importing TensorFlow and Horovod and its first Keras step tracing the model (~1.9 s
before the AutoGraph changes above, ~0.55 s with them). The pool pays the imports
ahead of time.

- **Who owns what.** One *keeper* per (interpreter, kind) (`pool/keeper.py`,
  `python -m jupyter_distrain.pool.keeper DIR KIND`), kinds `horovod` (TensorFlow
  + Horovod + Keras imported), `tensorflow` (for the tf and ps backends), `torch` and
  `jax`. The notebook starts it detached at submit (`LocalKind.choose_pool`,
  writing the socket into the spec as `pool_socket`); it is not a descendant of any
  supervisor, which would sweep it away as a leftover. It keeps one *zygote* per
  environment (`python -m jupyter_distrain.pool.idle FD KIND --zygote`): the zygote
  imports once and then forks each idle process on request, twice so that the keeper
  (a subreaper) is the new process's parent (`pool/idle.py serve_forks`). A refill
  is a fork (~50 ms), not an import (~4 s of CPU). A forked process takes a session of
  its own (its own scheduling autogroup), dies with the keeper, and draws new seeds
  for numpy's and torch's global generators (seeded at import: without it, every
  rank forked from one zygote drew the same numbers; Python's `random` reseeds itself
  at fork). Idle processes and the zygote are the keeper's children, each holding one
  end of a `SOCK_SEQPACKET` pair; they die with it while idle. Its directory is
  `<jobs root>/.pools/<kind>-<digest of the
  interpreter>-<digest of the code>/` (0700): `keeper.sock` (0600, peer uid
  checked; in the user's runtime directory, named by a digest, where that path is too
  long for a Unix socket), `state.json`, `keeper.log`, `pool.log` (the idle processes' output before
  they are claimed), and `off` once a claim could not enter a job's network namespace
  (non-root without user namespaces: the pool turns itself off, with one log line,
  and jobs start cold instead of paying a failed claim each). The code digest is the
  installed versions of numpy, TensorFlow, Keras and Horovod (package metadata) and
  this package's version and source fingerprint (count, sizes, newest mtime of its
  `.py` files): after an upgrade or an edit, jobs go to a new pool and the old one is
  drained (a warm worker never runs old code beside cold ones).
- **Threads of the pre-import.** `setns` moves only the calling thread. The threads
  importing left running were OpenBLAS's thread servers (numpy's and scipy's), which
  stayed in the host's namespace and on every CPU; a pooled process shuts them down
  after the pre-import (OpenBLAS restarts them at the job's first BLAS call, from the
  job's thread), and a claim checks every thread's namespace and sets every thread's
  CPUs. A kind whose imports leave any other thread running is not pooled.
- **Claim.** `LocalLauncher.start` asks the keeper for a process for each worker
  bootstrap it would start (`python -m jupyter_distrain.worker`), sending argv,
  the full environment, working directory, log path, CPUs and its own network
  namespace as a descriptor (SCM_RIGHTS). The keeper checks the environment: a
  pooled process imported with the environment of the job that asked for the
  pool, so everything a library may read at import must be equal; what is set per
  job or per process (`JUPYTER_DISTRAIN_*`, `HOROVOD_*`, `TF_CONFIG`,
  `CUDA_VISIBLE_DEVICES`, and the job's `--env` names that are not `TF_*`, `OMP_*`,
  `CUDA_*`... `pool/kinds.py`) is given at claim time. A ready process then
  redirects its output to the job's log, `setns`es into the job's network
  namespace (so nothing it starts is reachable from another host, as for a cold
  worker), takes the job's environment (changing only the names that differ, and
  keeping what its imports set, such as TensorFlow's `TF2_BEHAVIOR=1`, which a cold
  worker has once its program imports TensorFlow), changes directory, sets its CPU affinity, makes
  the worker bootstrap `__main__`, answers, and runs `worker.main()`: from there
  it is the same code path as a cold worker, and `hvd.init()` and TensorFlow's
  runtime start only now, so `tf.config.set_visible_devices`, memory growth and
  thread settings still work. A claim that finds no ready process but one still
  importing waits for it (up to 8 s: a cold start would import beside it on the
  same cores); any refusal means a cold start, logged in the supervisor's log.
- **The handle.** The supervisor gets a `PooledProcess` (pid + start time, like
  every handle): signals, memory and liveness through psutil; the exit code comes
  from the keeper (the parent) on the claim's connection. If that connection
  closes because the supervisor died, the keeper kills the process and what it
  started. If the keeper dies, a pooled process's exit code is its own `bye` (the
  supervisor takes a pooled process's bye), else `EXIT_LOST` (255) after 2 s, never 0;
  if the keeper and the supervisor both die, the warden kills the job's pooled
  processes by the pid and start time in state.json (`warden.kill_pooled`): claimed
  processes cleared their parent-death signal, so nothing else would. The keeper is a
  subreaper and kills the orphans of a finished pooled process (same session or
  the same job directory in their environment).
- **Refill: one run ahead.** Each claim keeps the pool at least as large as the
  number of processes its run (one generation of a job: the launcher's `run_id`) has
  claimed so far, with the claim's environment, so the processes for the next run
  are forked while this one starts (a new environment replaces the pool's, as a
  `want` does). The first job of a pool runs cold and has the zygote import beside
  it; every later run's claims only fork. A claim never waits for what its own run
  asked for (that is for the run after), but does wait up to 8 s for a zygote that
  imports for an earlier run. `LocalLauncher.close` still says `want` (the job's
  count) at the end, and a scale by checkpoint-and-restart asks for the new size as
  soon as it is requested (`Launcher.expect`), so the new ranks are ready when the
  old ones have checkpointed. `JUPYTER_DISTRAIN_POOL_AHEAD=0` (per job) refills only
  at the end, as before, to measure the difference.
- **Priority of what imports beside a job.** The keeper knows a job runs while its
  supervisor holds a `running` connection (sent before its first claim) or a claimed
  process lives. A zygote started meanwhile is *lowered* (`pool/priority.py`): its
  session's autogroup at nice 19 and, where it can be undone (root, `CAP_SYS_NICE`,
  `RLIMIT_NICE` 20), `SCHED_IDLE`; it is put back when no job runs, when a claim waits
  for it, and before any of its processes is handed over. Why both: with
  `kernel.sched_autogroup_enabled` (Debian's default) every session is a scheduling
  group and groups share the CPU fairly whatever their threads' policies, so a
  `SCHED_IDLE` import alone took a third of the 2 cores from a 2-rank job (measured:
  first step 1 s later). Measured before the zygote, with each idle process importing
  itself at idle priority beside the job (`launch_overhead.py --rounds 4 --steps 300`):
  the job trained at 20.7-21.1 steps/s against 23.4-24.2 with the refill at the end,
  and the next run straight after still waited for the imports (first step 3.0-3.8 s):
  on 2 busy cores nothing imports for free, which is why the pool forks instead.
- **No AutoGraph warm-up.** An earlier opt-in had idle processes convert, ahead
  of time, the library functions the last job's first step converted (17 for a
  Horovod Keras `fit`): the first step went from ~1.9 s to ~0.55 s, but pooled
  workers measured 3% slower at training (0.969 +- 0.007 of cold ones over 4
  alternated pairs; cause not found). Once Horovod's code was no longer converted
  (above) one Keras function was left for it (0.02 s), and it was removed.
- **Collected, then frozen.** After its imports, a pooled process (the zygote, before
  it forks) runs `gc.collect()` and then `gc.freeze()`
  (`pool/idle.py freeze_imported_objects`). TensorFlow, Keras and Horovod leave ~280k
  objects that live as long as the process. A cold worker's full collections scan them
  all: 0.13 s each, two before its first step. A pooled process's collections scan
  only what its job made. The collector also never writes the frozen objects' headers,
  so forked processes keep sharing those pages (2.1-2.2 MiB held alone per idle
  Horovod process). This was found with a `gc.callbacks` timer: the first model build
  in a pooled rank took 0.26 s of CPU, against 0.08 s in a fresh process, and one
  `isinstance` call took 0.11-0.14 s of it (a generation-2 collection). Measured with
  `/tmp`-style timing of a warm 2-rank re-run, the first step came 1.30-1.64 s after
  submit before and 1.10-1.28 s after (`tests/test_pool.py` checks that a pooled rank
  has frozen objects and a cold one none).
- **A run's claims come first.** The supervisor claims a run's processes one after
  another. The keeper's loop used to refill (a fork of the zygote, the memory bound
  measured) after each claim, so the run's second claim waited ~30 ms. Now the refill
  waits until no claim came for 0.1 s (`CLAIMS_QUIET_SECONDS`); `state.json` is still
  written after each claim (deferring it too left the listing showing claimed processes
  as idle while the refill ran: `test_pool` failed so, 1 run in 4).
- **Bounds.** Memory: no process is started while less than 2 GiB is free, or when
  the zygote (at its size; 512 MiB while the first imports) and the idle processes
  (each at what it holds alone, its unique set size: what it wrote since the fork;
  64 MiB before one was measured) would pass `JUPYTER_DISTRAIN_POOL_MEMORY` (a
  quarter of the RAM). A Horovod zygote holds ~400 MiB, each idle process forked from
  it a few MiB of its own. Time: unused for
  `JUPYTER_DISTRAIN_POOL_IDLE` seconds (600) the keeper ends its processes and
  exits. `%distributed pool [--clear]` lists (idle, starting, running a job, the
  zygote, memory) or ends them, here, on the ssh hosts and on the Ray clusters' nodes
  jobs started pools on;
  `--no-pool` and `JUPYTER_DISTRAIN_POOL=0` turn it off
  (the test suite runs with it off; `tests/test_pool.py` turns it on).
- **Pools where the workers are** (`launchers/agent/pooled.py`). With the ssh and
  Ray launchers each worker bootstrap's request to the host agent carries `pool`
  (kind, run id, per-job names, the notebook's pool bounds). The agent starts the
  host's keeper (detached: before it becomes a subreaper, or its sweep would kill it)
  in `~/.jupyter_distrain/jobs/.pools/host-<digest of the host name>/` (hosts may
  share a home), announces the running job and claims as the local launcher does,
  handing over its own network namespace, its stdout (the connection back, or the
  Ray node's log) as the process's output, and for Ray the memory file with the
  job's secret (`contract/handoff.py`) as a descriptor. The process reports
  `pooled`; the agent kills it (not its child) when cut off, and the keeper kills it
  when the agent's claim connection closes. The hosts an ssh job asked are kept in
  `.pools/ssh-hosts.json` (how to reach them), so `%distributed pool` asks each
  host's agent (`pools [--drain]`). A Ray cluster whose nodes a job asked for a
  pooled process is kept in `.pools/ray-clusters.json` (its address, written by the
  supervisor); `%distributed pool` runs a Ray driver of its own per cluster
  (`python -m jupyter_distrain.launchers.ray.pools ADDRESS [--drain]`, as the
  probe: the kernel never becomes a driver), which asks every alive node for the
  same listing with a zero-CPU task pinned to it (a few seconds: a Ray worker
  starts on each node). Slurm tasks start cold (their allocation's nodes change
  from job to job).
- **Measured** (`benchmarks/launch_overhead.py --rounds 16 --steps 300`, 2 cores,
  2026-12-03; per-round paired ratios, 95% CI): steps/sec warm/horovodrun 1.023
  (0.982-1.065), back to back (a run started as the last ended) 1.006 (0.966-1.046),
  warm/cold 1.028 (0.991-1.064), warm/refill-at-end 1.028 (0.995-1.060: forking the
  next run's processes does not slow the job); time to first step warm 1.60 s, back to
  back 1.53 s, cold 4.22 s (0.493x horovodrun's 8.83 s). Pool memory: the zygote 411
  MiB resident, each idle process 2.1-2.2 MiB of its own. Where a warm run's 1.6 s go
  (phases printed by the program, 2 workers): ~0.2 s from the cell to the job's
  supervisor writing its state (the magic, the spec, the supervisor's start), ~0.1 s
  to the ranks running, then in the program 0.11-0.13 s `hvd.init()`, 0.3-0.4 s
  building and compiling the model (TensorFlow's runtime starts at its first op: it
  cannot start in the zygote, which must have one thread to fork safely) and 0.6 s
  the first traced step. Only one module is imported lazily after the pre-import
  (`keras.src.engine.base_layer_v1`): importing more would not help.
- **On hosts and nodes** (`benchmarks/launchers.py --rounds 3 --steps 300`, against
  `horovodrun --gloo -H` over the same two ssh hosts, median 8.86 s): time to first
  step warm local 1.51 s (0.171x), ssh 2.97 s (0.334x, 95% CI 0.304-0.365), Ray 8.27 s
  (0.910x); cold local 0.456x, ssh 0.601x, Ray 1.172x, Slurm 0.494x. A warm ssh run
  still pays the launcher's own ~1.5 s (pre-flight, unpack, a session per process)
  and a warm Ray run Ray's ~6 s (driver, placement, actors): the pool takes ~2.3 s
  off each. Steps/sec of every warm column within its interval of 1.
- **Then the launchers' own costs** (same benchmark, later the same day, horovodrun
  median 9.72 s; raw `launchers-20261203-160113.json`): kept ssh masters with the
  pre-flight remembered, the Ray probe remembered, Ray imported without jsonschema's
  IRI grammar. Time to first step, ratio to horovodrun (95% CI): ssh warm 2.28 s,
  0.241 (0.205-0.277); ssh cold 0.510 (0.376-0.644); ssh first contact (nothing kept,
  `JUPYTER_DISTRAIN_SSH_KEEP=0`) 0.560 (0.511-0.608); Ray warm 4.28 s, 0.445
  (0.435-0.455); Ray cold 0.696 (0.536-0.857); Ray first contact (no remembered probe)
  0.797 (0.783-0.811); local warm 0.155, cold 0.443; Slurm 0.450. Steps/sec: every
  interval holds 1. Where a warm ssh re-run's time goes now: the job is written at
  0.25 s (as locally: no pre-flight), the copy (`unpack`, over the kept master) takes
  0.38 s, the sessions 0.25-0.4 s, then the program ~1.2 s as locally. A warm Ray
  re-run: the supervisor's `import ray` and driver ~0.6 s (2 s before), the slots'
  actors 2.0 s (Ray starts a worker per actor on each node, each importing Ray with
  the IRI grammar: ours to skip only in our own processes), the starts 0.2 s each.
- **Then the first step itself** (2026-12-03, later): a pooled process collects and
  freezes what its imports made (above), a Keras 2 `fit` builds its optimizer before
  its first step (one trace of the train step, not two: see the AutoGraph section),
  plugins' entry points are read once per process, and the keeper refills only once a
  run's claims are over. `benchmarks/launch_overhead.py --rounds 6 --steps 300` (raw
  `launch_overhead-keras-20261203-184823.json`, horovodrun median 7.74 s): time to
  first step warm 0.97 s (median; 6 runs 0.97-1.00 s), back to back 0.99 s (0.91-1.16
  s), refill at end 0.99 s, cold 3.57 s (0.459x horovodrun, 95% CI 0.442-0.476);
  steps/sec warm/horovodrun 0.998 (0.967-1.028), warm/cold 1.001 (0.950-1.052), back
  to back/horovodrun 0.988 (0.962-1.014). `benchmarks/launchers.py --rounds 3 --steps
  300` (raw `launchers-20261203-183720.json`, horovodrun -H median 8.59 s): local warm
  1.07 s (0.125x), ssh warm 1.91 s (0.217x, 0.176-0.258), Ray warm 3.81 s (0.435x);
  cold local 0.431x, ssh 0.500x (0.406-0.595), Ray 0.720x (0.590-0.851), Slurm
  0.465x; first contact ssh 0.605x, Ray 0.829x. Where a warm local re-run's ~1.0 s
  go now: the cell to the supervisor's `launching` 0.17-0.2 s (the supervisor's
  imports are 0.13 s of it), the two claims 0.05 s, then in the program `hvd.init()`
  0.11 s, the model 0.15 s and the first traced step 0.5 s. An ssh session costs ~0.11
  s before the agent runs (a `true` over the kept master, measured) and the agent's
  start ~0.09 s: the copy is one such round trip before the sessions, which need
  the job's directory to exist for their forwarded sockets.
- **The files with the first session** (2026-12-03, evening): the forwarded sockets
  moved to a per-host directory that outlives jobs (`.sockets-<digest>/`, made by the
  pre-flight), so a session no longer needs the job's directory at its start, and the
  first session of a generation on each host carries the files after its request
  line (the sweep, the tar, then a mark the host's other sessions wait for). Only
  backends that reserve the hosts' ports before their plan, and mpirun's guards, still
  copy first (lazily: `reserve_ports` copies the hosts it is asked about). Warm ssh
  re-run, profile of the job's events (3 runs each, same machine, same hour): cell to
  `running` 0.93-0.98 s before, 0.68-0.78 s after; first step 1.66-1.75 s before,
  1.48-1.67 s after. The agent's own start was also trimmed: the finder of old module
  names (since removed) no longer subclassed `importlib.abc` (importing it pulled
  `importlib.resources`, `tempfile`, ~15 ms into every process of the package).
- **Then the standby and Ray's parallel starts** (2026-12-04; the files with the first
  session, the Ray starts not waited one by one, the supervisor on standby below).
  `benchmarks/launch_overhead.py --rounds 8 --steps 300` (every cell followed, as in a
  notebook; raw `launch_overhead-keras-20261204-160010.json`, horovodrun median 5.91
  s): time to first step warm 0.79 s (8 runs 0.75-0.81 s), back to back 0.90 s
  (0.87-0.93), refill at end 0.88 s (0.72-0.92), no standby 0.89 s (0.85-0.95), cold
  2.73 s (0.469x horovodrun, 95% CI 0.451-0.488); warm/no standby 0.877 (0.844-0.910).
  Steps/sec warm/horovodrun 1.044 (1.005-1.084), back to back/horovodrun 1.061
  (1.022-1.100), warm/cold 1.018 (0.986-1.050), warm/refill at end 0.995
  (0.956-1.034), warm/no standby 0.974 (0.938-1.010). Pool: zygote 410 MiB, each idle
  process 2.1-2.2 MiB of its own. `benchmarks/launchers.py --rounds 3 --steps 300`
  (raw `launchers-20261204-160617.json`, horovodrun -H median 6.45 s): warm local 0.93
  s (0.139x), ssh 1.23 s (0.187x, 0.151-0.222), Ray 2.71 s (0.410x, 0.361-0.459);
  cold local 0.432x, ssh 0.478x (0.421-0.535), Ray 0.694x (0.595-0.794), Slurm
  0.463x; first contact ssh 0.607x, Ray 0.810x. Steps/sec: every interval holds 1 or
  lies above it. A warm Ray run's actors still start a Ray worker each, which imports
  Ray with jsonschema's IRI grammar (~1.2 s of CPU here, where the nodes share the
  notebook's virtualenv and so Jupyter's `jsonschema[format-nongpl]`; a node without
  `rfc3987_syntax` installed does not pay it). The worker is Ray's, not ours: only a
  `py_executable` wrapper could change that, and it needs the node's interpreter.
  The same afternoon, 20 rounds (`launch_overhead-keras-20261204-162428.json`,
  horovodrun 5.86 s): warm 0.78 s (0.72-0.89), back to back 0.91 s (0.83-1.06), no
  standby 0.87 s; warm/no standby 0.902 (0.873-0.932); steps/sec warm/horovodrun 0.986
  (0.962-1.010), back to back 0.971 (0.952-0.990), cold 0.962 (0.938-0.985), warm/cold
  1.027 (0.999-1.055): against horovodrun every column of ours moved together from the
  8-round run an hour before (1.03-1.06), warm/cold did not. Following a cell costs
  the kernel 0.06 s of CPU over a 6 s job. `instrumentation_overhead.py --rounds 10`:
  with/without 1.002; `scale_latency.py --rounds 3`: 2 -> 3 by restart from the pool
  1.94 s, 0.44x a cold start of 3 (0.28-0.60), cold restart 1.23x, elastic 0.75x;
  `metrics_channel.py`: 306,591 records/s, no loss.
- **Then the standby with the job and each process's share of the cores**
  (2026-12-04 evening). `benchmarks/launch_overhead.py --rounds 12 --steps 300`
  with the standby started lowered at submit (raw
  `launch_overhead-keras-20261204-194052.json`, horovodrun 5.55 s): time to first
  step warm 0.73 s (0.67-0.79), back to back 0.72 s (0.65-0.84; 0.91 s, up to 1.06 s,
  before), no standby 0.86 s; steps/sec against horovodrun 0.95-0.97 (intervals
  0.90-1.01), warm/cold 1.016 (0.973-1.059). Then with the core share
  (`worker/threads.py`; raw `launch_overhead-keras-20261204-203223.json`, horovodrun
  5.68 s): warm 0.74 s (0.67-0.85), back to back 0.74 s (0.65-0.78), refill at end
  0.69 s, no standby 0.84 s (0.76-0.95), cold 2.65 s (0.467x, 0.452-0.482); every
  re-run of the 60 under 1.0 s. Steps/sec: cold 1.218x horovodrun (1.168-1.268),
  warm 1.219x (1.177-1.261), back to back 1.249x (1.178-1.319); warm/cold 1.003
  (0.967-1.039), back to back/cold 1.025 (0.983-1.068), warm/refill at end 0.992
  (0.963-1.020), warm/no standby time to first step 0.874 (0.835-0.914). Pool: zygote
  408 MiB, each idle process 2.1 MiB of its own. Looking for the residual before the
  share, 8 paired rounds of 1000 steps (`/tmp` script, not kept): cold/horovodrun
  0.978 (+-0.037), horovodrun in a private network namespace/horovodrun 1.021
  (+-0.048), cold without instrumentation/horovodrun 0.997 (+-0.041): nothing
  beyond the noise (single runs of one column spread 76-98 steps/sec); the steady
  CPU of the supervisor and of the following kernel together is ~0.012 cores.
  `benchmarks/launchers.py --rounds 2 --steps 300` after the share (raw
  `launchers-20261204-203923.json`, horovodrun -H 7.18 s, 70.0 steps/sec): warm local
  0.79 s (0.111x), ssh 1.28 s (0.179x), Ray 2.85 s (0.398x); cold local 0.405x, ssh
  0.461x, Ray 0.662x, Slurm 0.450x; first contact ssh 0.570x, Ray 0.823x. Steps/sec
  local 1.32x horovodrun -H; ssh, Ray and Slurm ~1.0x: their "hosts" are network
  namespaces of this one machine, one rank each, so the share (per job per host)
  does not apply and the two ranks still split 2 cores between TensorFlow's default
  pools, as horovodrun -H's do. 2 rounds: the intervals are wide.
- **The same code, measured again at length** (2026-12-04 night, machine idle).
  `launch_overhead.py --rounds 20 --steps 300` (raw
  `launch_overhead-keras-20261204-234208.json`, horovodrun 5.36 s, 88.9 steps/sec):
  time to first step warm 0.67 s (20 runs 0.62-0.92), back to back 0.69 s
  (0.63-0.85), refill at end 0.68 s (0.62-0.76), no standby 0.83 s (0.75-0.85), cold
  2.58 s (0.466x, 0.456-0.477). Steps/sec against horovodrun: cold 1.188
  (1.153-1.223), warm 1.202 (1.162-1.242), back to back 1.204 (1.164-1.244), refill
  at end 1.212; warm/cold 1.014 (0.982-1.046), back to back/cold 1.015 (0.985-1.044),
  warm/refill at end 0.992 (0.962-1.023). `rerun_chain.py --rounds 8 --steps 150`
  (three different cells back to back and the last again, each round after a pause):
  32 of 32 runs under 1.0 s, medians 0.74 / 0.69 / 0.72 / 0.74 s, slowest 0.85 s.
  `launchers.py --rounds 3` (raw `launchers-20261204-235138.json`, horovodrun -H
  6.24 s): warm local 0.71 s (0.117x), ssh 1.10 s (0.180x), Ray 2.54 s (0.414x);
  cold local 0.426x, ssh 0.478x (0.450-0.506), Ray 0.685x (0.602-0.768), Slurm
  0.474x; first contact ssh 0.600x, Ray 0.843x. `scale_latency.py --rounds 3`: 2 -> 3
  by restart from the pool 1.56 s, 0.43x a cold start of 3 (0.29-0.57); cold restart
  1.20x, elastic 0.77x. `instrumentation_overhead.py --rounds 10`: 1.003;
  `metrics_channel.py`: 361,273 records/s, no loss. Pool: zygote 411 MiB, each idle
  process 2.1 MiB of its own.
- **A scale from the pool** (`benchmarks/scale_latency.py --rounds 2`): 2 -> 3 workers
  by checkpoint-and-restart 3.25 s with the pool against 5.64 s for a cold start of 3
  workers (0.58x; cold restart 1.16x; elastic Horovod in place 0.66x).
- **A supervisor on standby** (`client/standby.py`, `supervisor/standby.py`). A cold
  supervisor is a new Python importing the supervisor, a launcher and a backend:
  ~0.1 s of every run's way to its first step, warm or not (measured: warm/no standby
  0.877 of the time to first step, 0.79 s against 0.89 s). With pools on, the
  kernel starts one for the next job as it submits a job:
  `python -m jupyter_distrain.supervisor.standby`, every launcher and backend
  imported, its stdin one end of a private `SOCK_SEQPACKET` pair. It imports
  lowered beside the running job, as the pool's refill does (`pool/priority.py`: its
  autogroup at nice 19, `SCHED_IDLE` where that can be undone), so it takes only CPU
  time the job leaves, and is put back to normal when the job's follow ends or when it
  is handed a job, before it starts that job's processes (which inherit its
  priority). Until 2026-12-04 it was started when a followed job ended, so a re-run
  straight after a run found it still importing, and an API `submit` + `wait` never
  had one. Where nothing can be lowered and put back (`priority.can_lower`), it is
  still started when a followed job ends. The next job's
  `start_supervisor` hands it the job directory, the kernel's environment and
  directory (as they are now, not when it started: the C library's `environ`, which
  a cold start's child inherits, not `os.environ`, which misses what native code set
  with `setenv`; under pytest `COLUMNS`, which made every claim of a standby-run job
  miss the pool) and the job's lock (a descriptor);
  it takes them, puts the supervisor log on its stdout and stderr, answers its pid
  and runs `supervisor.main` as the cold start does (it becomes the warden; the
  control file names both). Used once; left for the next job by a `--no-pool` job
  (cold means all of it cold); not used, and ended, when pools are off or
  the package's source changed since it started (the pool's own fingerprint); any
  failure of the hand-over (no answer in 5 s, an error) ends it and starts cold. An
  unused standby ends when its kernel does (its end of the pair closes), so it needs
  no reaper. What it costs: ~30 MiB resident per kernel. What it changes: its
  command line does not name the job (the control file's `pid` and `warden_pid` do).
- **What a job can tell.** Its parent process is the keeper, not the supervisor;
  `sys.modules` holds the pre-imported libraries (which its program imports
  anyway) and `jupyter_distrain.pool.idle`. Its environment,
  directory, `sys.argv`, `__main__`, network namespace and Horovod are its own.
"""
