"""A simulated cluster on one box: hosts in network namespaces, latency to Redis, a dead host. Needs root.

Run (as root, from the repository root): python -m bench.cluster [--hosts 4] [--workers-per-host 2] [--concurrency 16]
               [--rtts direct,0,0.5,2,10] [--window 10] [--rounds 1] [--outage 12[,35]]
               [--profiles defaults,tuned] [--skip-dead-host]
               [--stagger 0] [--out cluster]
The 256-process run (writes bench/results/cluster_256.json):
               python -m bench.cluster --hosts 8 --workers-per-host 32 --concurrency 4 --stagger 0.25
               --rtts 0.5,2,10 --window 20 --skip-dead-host --keep-workers --out cluster_256
(``--keep-workers`` starts the 256 processes once and changes the proxies' delay in place between settings:
starting them costs about 150 CPU-seconds here; without it each setting starts its processes afresh, and
``--budget`` skips the settings that would not end in time)

What it builds, and removes again on exit, Ctrl+C or SIGTERM included (a ``finally`` and signal
handlers; every process it started is stopped by its pid, every namespace it made deleted):

- a "redis" network namespace running one redis-server, and N "host" namespaces plus one "producer"
  namespace, each joined to the redis namespace by a veth pair of its own: host i is 10.231.<i+1>.2
  and reaches Redis at 10.231.<i+1>.1; the producer is 10.231.250.2. Only these namespaces hold
  10.231.x.y addresses; there is no default route and no forwarding anywhere, and nothing links them
  to the machine's own network, so all traffic stays between the namespaces made here.
- per host, bench/delay_proxy.py on 127.0.0.1:6380 inside the host namespace, forwarding to Redis
  with half the round trip added each way (this kernel has no netem qdisc). ``direct`` runs without
  the proxy, ``0`` through it with no delay: the proxy's own cost.
- per host, ``--workers-per-host`` stock ``rq worker -w rollq.worker.RolloutWorker`` processes on the
  mock-LLM agent (3 turns x U(0.1, 0.5) s with spans), concurrency ``--concurrency`` each;
- the producer and trainer in the producer namespace (this script run again there with ``--role
  producer``): it keeps tasks queued, reads every rollout through a consumer group, and measures Redis.

Per round-trip setting: rollouts/s and % of the ideal rate (in flight / 0.9 s), the
round trip a PING actually took through the proxy, Redis connections, commands/s and CPU, worker CPU
per rollout, proxy CPU, client->Redis writes per rollout seen by the proxies (each is one round
trip: a command, a pipeline or a Lua call), and each worker's time from its start to its first claim.

Per setting also: the machine's load average at the window's start and end, and the resident and unique
memory of the worker processes (psutil RSS and USS: USS is what one more process really costs, RSS
counts the shared libraries again in every process). ``--stagger`` spaces the worker starts (each
costs about 0.6 CPU-seconds of imports), so 256 processes do not all import at once.

Dead host (at the 2 ms setting unless ``--skip-dead-host``), once per ``--outage`` (comma-separated seconds)
and per ``--profiles`` entry: a fixed task list; a few seconds in, host 0's link is taken down for the outage,
then restored. Profiles (``bench.cluster.measure.DEAD_HOST_PROFILES``): ``defaults`` sets nothing, so every
rollq default applies (5 s heartbeats, ``unresponsive_seconds`` 30: an outage shorter than that reaps nothing,
host 0's tasks wait for its link); ``tuned`` has 1 s heartbeats and ``unresponsive_seconds`` 6. Each profile's
settings, defaults resolved to their values (bench/settings.py, as bench/failover.py records them), are written
beside its figures. Reported: rollouts received (before the cut, while down, after the restore), lost and
duplicated, seconds from the restore to the last one received, attempts requeued as unresponsive, late results
kept as superseded, tasks host 0 claimed after the link came back, and whether its workers were all still running.

The defaults (4 hosts x 2 processes x 16 in flight = 128 in flight) are what 2 shared cores carry at
full speed. 8 hosts x 32 processes x 4 in flight (1024 in flight) runs on them too, CPU-bound: there
the figures are connections, Redis load and start-up at fleet size, not the fleet's rollout rate
(the machine's cores, not Redis, set it). It needs about 51 MB of memory per worker process (USS); the
script checks MemAvailable first. Writes bench/results/<--out>.json (cluster.json by default).

The parts: :mod:`bench.cluster.network` (namespaces, veth links, the redis-server, the delay proxies),
:mod:`bench.cluster.fleet` (the worker processes: their command, memory, first claims),
:mod:`bench.cluster.measure` (one setting, or one fleet across settings, measured from the driver),
:mod:`bench.cluster.producer` (the producer and trainer, run inside their namespace) and
:mod:`bench.cluster.__main__` (the command line).
"""
