"""Launchers side by side: the same 2-worker Horovod Keras job through
``horovodrun --gloo -H`` over two ssh hosts, and through ``%%distributed`` on the local
launcher, the ssh launcher (over the same hosts), the Ray launcher (a two-node Ray
cluster, one CPU per node, so the two slots land on both) and the Slurm launcher (the
test suite's Slurm cluster: two slurmd nodes, ``--nodes 2``). The Slurm job's time in
Slurm's queue (its ``allocation`` event) is left out of its time to first step and shown
apart; horovodrun runs over the ssh hosts (the Slurm nodes run no sshd). Each launcher
runs cold (``--no-pool``); local, ssh and Ray also warm (``... warm``: taken from the
pool on this machine, on each host, on each node; each primed by one run before the
rounds, each run forking the next run's processes). Cold and warm ssh runs go through
the kept ssh connections, cold and warm Ray runs recall the pre-flight's probe; ``ssh
first`` and ``ray first`` are cold runs as the first on their hosts (no kept
connection: the job opens its own and the pre-flight connects; no remembered probe).

The hosts are the test suite's (tests/multihost.py, tests/raycluster.py): network
namespaces on this machine behind a bridge, each running Debian's sshd on port 2222, or
a Ray node (root needed). Each round runs
every launcher once, the order rotating; rank 0 prints the wall-clock time of its first
finished step and its steps/sec after a warm-up (launch_overhead.py's script). Reported:
medians, and the mean of per-round ratios against horovodrun with a 95% confidence
interval. Raw figures go to ``benchmarks/results/``.

    .venv/bin/python benchmarks/launchers.py [--rounds 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from launch_overhead import (  # noqa: E402
    bench_session,
    mean_with_interval,
    parse,
    run_distributed,
    save_rounds,
)
from multihost import SSH_PORT, SshCluster, ssh_cluster  # noqa: E402
from raycluster import ray_cluster  # noqa: E402
from slurmcluster import slurm_cluster  # noqa: E402

INTERFACE = "jdeth0"  # the hosts' interface; the bridge gets the same name for horovodrun


def run_horovodrun(script: Path, cluster: SshCluster) -> tuple[float, float]:
    horovodrun = Path(sys.executable).with_name("horovodrun")
    hosts = ",".join(f"{h.address}:1" for h in cluster.hosts)
    started = time.time()
    proc = subprocess.run(
        [str(horovodrun), "--gloo", "-np", "2", "-H", hosts, "-p", str(SSH_PORT)]
        + ["-i", str(cluster.identity), "--network-interface", INTERFACE]
        + [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=script.parent,
    )
    if proc.returncode:
        raise RuntimeError(f"horovodrun failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    first, rate = parse(proc.stdout)
    return first - started, rate


@contextlib.contextmanager
def first_contact() -> Iterator[None]:
    """A run as the first on its hosts or cluster: no ssh connection kept from earlier
    runs (``JUPYTER_DISTRAIN_SSH_KEEP=0``: the job opens its own, and the pre-flight
    connects and checks), no remembered Ray probe."""
    from jupyter_distrain.contract.private import runtime_dir

    for remembered in runtime_dir().glob("ray-probe-*.json"):
        remembered.unlink()
    os.environ["JUPYTER_DISTRAIN_SSH_KEEP"] = "0"
    try:
        yield
    finally:
        del os.environ["JUPYTER_DISTRAIN_SSH_KEEP"]


def queue_seconds(job) -> float:
    """How long the Slurm job's allocation waited in Slurm's queue."""
    return sum(e["queued"] for e in job.dir.read_events() if e["event"] == "allocation")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    os.environ["JUPYTER_DISTRAIN_POOL"] = "1"  # cold columns say --no-pool
    with (
        bench_session(args.steps) as (tmp, code, script, shell),
        ssh_cluster(tmp / "hosts", bridge=INTERFACE) as cluster,
        ray_cluster(tmp / "ray") as ray,
        slurm_cluster(tmp / "slurm") as slurm,
    ):
        flags = {
            "local": "",
            "ssh": cluster.flags(),
            "ray": ray.flags(),
            "slurm": f"{slurm.flags()} --nodes 2",
        }
        queued: list[float] = []  # each Slurm run's seconds in the queue
        warm = [f"{name} warm" for name in ("local", "ssh", "ray")]
        for name in warm:  # primes the pool there (the first run imports beside it)
            run_distributed(shell, code, flags[name.split()[0]])
        first_runs = ["ssh first", "ray first"]  # cold, and nothing kept from earlier runs
        columns = ["horovodrun", *flags, *warm, *first_runs]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in columns}
        for i in range(args.rounds):
            shift = i % len(columns)
            for name in columns[shift:] + columns[:shift]:
                if name == "horovodrun":
                    res = run_horovodrun(script, cluster)
                elif name == "slurm":
                    ran: list = []
                    first, rate = run_distributed(shell, code, f"{flags[name]} --no-pool", ran)
                    queued.append(queue_seconds(ran[0]))
                    res = (first - queued[-1], rate)
                elif name in warm:
                    res = run_distributed(shell, code, flags[name.split()[0]])
                elif name in first_runs:
                    with first_contact():
                        res = run_distributed(shell, code, f"{flags[name.split()[0]]} --no-pool")
                else:
                    res = run_distributed(shell, code, f"{flags[name]} --no-pool")
                results[name].append(res)
                print(
                    f"round {i + 1} {name:<11} first step {res[0]:6.2f} s {res[1]:7.1f} steps/s",
                    flush=True,
                )
        from jupyter_distrain.client.commands import print_pools

        print_pools(clear=False)  # what the pools hold here and on the hosts
        print_pools(clear=True)
    print()
    print(f"{'launcher':<12}{'time to first step (s)':>24}{'steps/sec':>12}")
    for name, rs in results.items():
        first = statistics.median(r[0] for r in rs)
        rate = statistics.median(r[1] for r in rs)
        print(f"{name:<12}{first:>24.2f}{rate:>12.1f}")
    print(
        f"slurm: time in Slurm's queue (left out above), median {statistics.median(queued):.2f} s"
    )
    for name in columns[1:]:
        pairs = list(zip(results[name], results["horovodrun"], strict=True))
        for label, column in (("time to first step", 0), ("steps/sec", 1)):
            mean, low, high = mean_with_interval([d[column] / h[column] for d, h in pairs])
            print(f"{name}/horovodrun {label}: {mean:.3f} (95% CI {low:.3f}-{high:.3f})")
    save_rounds("launchers", args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
