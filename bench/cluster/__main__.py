"""The command line: ``python -m bench.cluster`` (as root, from the repository root); see :mod:`bench.cluster`."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench.cluster
from bench.cluster.fleet import check_memory
from bench.cluster.measure import DEAD_HOST_PROFILES, dead_host_settings, run_kept, run_setting
from bench.cluster.network import Cluster
from bench.cluster.producer import producer_role, producer_schedule
from bench.common import write_result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=bench.cluster.__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--rtts",
        default="direct,0,0.5,2,10",
        help="'direct' (no proxy) or round trips in ms; '' for none (the dead host only)",
    )
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1, help="times to run every round-trip setting")
    parser.add_argument(
        "--outage", default="12", help="seconds host 0's link stays down; comma-separated: a dead-host run each"
    )
    parser.add_argument(
        "--profiles",
        default=",".join(DEAD_HOST_PROFILES),
        help="the dead host's settings, comma-separated: " + ", ".join(DEAD_HOST_PROFILES),
    )
    parser.add_argument("--dead-host-tasks", type=int, default=3000)
    parser.add_argument("--dead-host-rtt", default="2")
    parser.add_argument("--skip-dead-host", action="store_true")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds between worker process starts")
    parser.add_argument("--keep-logs", help="copy every process's log to this directory at the end")
    parser.add_argument("--out", default="cluster", help="results name: bench/results/<out>.json")
    parser.add_argument(
        "--budget", type=float, default=0.0, help="seconds: skip a setting that would end past them (0: no limit)"
    )
    # Internal: the producer process inside its namespace.
    parser.add_argument("--role", default="driver", choices=["driver", "producer"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--in-flight", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--link-down", help=argparse.SUPPRESS)
    parser.add_argument("--unresponsive-seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--schedule", help=argparse.SUPPRESS)
    parser.add_argument("--rtt-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-workers",
        action="store_true",
        help="start the worker processes once and change the proxies' round trip in place (needs delayed settings)",
    )
    args = parser.parse_args()
    if args.role == "producer":
        try:
            if args.schedule:
                producer_schedule(args)
                return
            if not args.link_down:
                args.dead_host_tasks = 0
            producer_role(args)
        except Exception as exc:
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
            raise
        return
    if os.geteuid() != 0:
        sys.exit("bench.cluster needs root (network namespaces and veth pairs): run it with sudo")
    if shutil.which("ip") is None:
        sys.exit("bench.cluster needs iproute2's `ip`")

    def interrupted(signum: int, frame: Any) -> None:
        raise SystemExit(f"interrupted by signal {signum}; cleaning up")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupted)
    if args.keep_workers and "direct" in args.rtts.split(","):
        sys.exit("--keep-workers changes the proxies' delay: 'direct' (no proxy) cannot be one of its settings")
    profiles = args.profiles.split(",")
    unknown = [p for p in profiles if p not in DEAD_HOST_PROFILES]
    if unknown:
        sys.exit(f"unknown profiles {unknown}; known: {', '.join(DEAD_HOST_PROFILES)}")
    outages = [float(o) for o in args.outage.split(",")]
    check_memory(args.hosts * args.workers_per_host)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    skipped: list[str] = []
    longest = 0.0  # the longest setting so far: the next one is assumed to take as long
    with tempfile.TemporaryDirectory(prefix="rollq-cluster-") as tmp:
        cluster = Cluster(args.hosts, Path(tmp))
        try:
            cluster.build()
            cluster.start_redis()
            if args.keep_workers:
                rows = [{**row, "round": 1} for row in run_kept(cluster, args, args.rtts.split(","))]
            for round_ in range(0 if args.keep_workers else args.rounds):
                settings = [s for s in args.rtts.split(",") if s]
                # Alternate the order round by round, so that drift on the shared machine hits every setting alike.
                for rtt in settings if round_ % 2 == 0 else list(reversed(settings)):
                    if args.budget and time.monotonic() - began + longest > args.budget:
                        print(f"skipping the {rtt} setting: it would end past --budget {args.budget:.0f} s", flush=True)
                        skipped.append(rtt)
                        continue
                    at = time.monotonic()
                    rows.append({**run_setting(cluster, args, rtt, dead_host=False), "round": round_ + 1})
                    longest = max(longest, time.monotonic() - at)
            if not args.skip_dead_host:
                for outage in outages:
                    for profile in profiles:
                        rtt = args.dead_host_rtt
                        dead.append(run_setting(cluster, args, rtt, dead_host=True, profile=profile, outage=outage))
        finally:
            cluster.close()
            if args.keep_logs:  # the workers', proxies', producer's and Redis's logs, before tmp goes
                Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, Path(args.keep_logs) / log.name)
    processes = args.hosts * args.workers_per_host
    note = (
        "2 shared cores: 4 hosts x 2 worker processes stand in for the issue's 8 x 32"
        if processes < 256
        else f"{processes} worker processes x {args.concurrency} in flight on 2 shared cores: CPU-bound, so "
        "rollouts/s and % of ideal show the machine's cores; connections, Redis load and start-up are the fleet's"
    )
    write_result(
        args.out,
        {
            "hosts": args.hosts,
            "workers_per_host": args.workers_per_host,
            "concurrency": args.concurrency,
            "stagger_seconds": args.stagger,
            "note": note,
            "run_seconds": round(time.monotonic() - began),
            "rows": rows,
            "settings_skipped_for_time": skipped,
            "dead_host_profiles": {p: dead_host_settings(p) for p in profiles},
            "dead_host": dead,
        },
        sys.argv[1:],
        module="bench.cluster",
        settings=vars(args),
    )


if __name__ == "__main__":
    main()
