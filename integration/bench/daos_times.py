"""What the two DAOS lifecycle benchmarks read the same way (imported by
the Python parts of daos-lifecycle.sh and daos-lifecycle-sequential.sh)."""
import datetime as dt
import statistics as st

# daos-sim's SIGTERM flag poll (server.rs / agent.rs main loops): counted
# at this bound as a simulator wait.
POLL = 0.05


def ts(s):
    """RFC 3339 UTC with up to 9 decimals → epoch seconds."""
    s = s.rstrip("Z").split("+")[0]
    head, _, frac = s.partition(".")
    t = dt.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return t + float("0." + frac) if frac else t


COLS = ["total", "setup", "run", "cleanup", "sim_join", "sim", "overhead"]


def report(title, key, width, rows, steps, steps_note):
    """Print each row's COLS (rows are dicts named by `key`), their medians,
    the median of each step in `steps`; return the medians."""
    med = {c: st.median(r[c] for r in rows) for c in rows[0] if c != key}
    print(f"\n{title}, {len(rows)} runs (seconds)")
    print(f"{key:<{width}}" + "".join(f"{c:>11}" for c in COLS))
    for r in rows:
        print(f"{r[key]:<{width}}" + "".join(f"{r[c]:11.3f}" for c in COLS))
    print(f"{'median':<{width}}" + "".join(f"{med[c]:11.3f}" for c in COLS))
    print(f"\nmedian per step{steps_note}")
    for s in steps:
        print(f"  {s:<13}{med[s]:7.3f}")
    return med


# Who used the CPU while the jobs ran (PERF_CPU=1): `perf record -a`
# samples, grouped by the sampled thread's name.
CPU_GROUPS = [
    ("gpuq (broker, nodes' helpers)", lambda c: c.startswith(("gpuq-broker", "gpuq-node"))),
    ("runc (create, start, exec, kill, delete; runc init)", lambda c: c.startswith("runc") or c == "exe"),
    ("conmon", lambda c: c == "conmon"),
    ("simulator (daos_server, daos_agent, dmg)", lambda c: c.startswith(("daos_", "dmg"))),
    ("ssh, sshd (node links)", lambda c: c in ("ssh", "sshd")),
    ("bench harness (gpuq CLI polls, shell, python)",
     lambda c: c in ("gpuq", "bash", "python3", "sed", "mv", "mkdir", "seq", "sleep", "perf")),
]


def cpu_report(samples, freq, jobs, wall):
    """samples: (thread name, pid, time) of every sample; Podman's
    services are the `podman` processes sampled across the whole run, the
    others are its exit commands (`podman container cleanup`, one per
    container that ends)."""
    span = {}
    for comm, pid, t in samples:
        if comm == "podman":
            a, b = span.get(pid, (t, t))
            span[pid] = (min(a, t), max(b, t))
    t0 = min(t for _, _, t in samples)
    t1 = max(t for _, _, t in samples)
    services = {p for p, (a, b) in span.items() if b - a > 0.5 * (t1 - t0)}
    count = {}
    for comm, pid, _ in samples:
        if comm == "swapper":
            g = "idle"
        elif comm == "podman":
            g = ("podman (the five API services)" if pid in services
                 else "podman (exit commands: container cleanup)")
        else:
            g = next((name for name, f in CPU_GROUPS if f(comm)), "other (kernel threads, ...)")
        count[g] = count.get(g, 0) + 1
    per_job = {g: n / freq / jobs for g, n in count.items()}
    busy = sum(v for g, v in per_job.items() if g != "idle")
    print(f"\nCPU per job (seconds of CPU; {jobs} jobs, {wall / jobs:.2f} s of wall time each, "
          f"{len(samples)} cpu-clock samples at {freq} Hz on every CPU)")
    for g, v in sorted(per_job.items(), key=lambda kv: -kv[1]):
        if g != "idle":
            print(f"  {g:<52}{v:6.3f}  {v / busy:4.0%}")
    print(f"  {'all busy':<52}{busy:6.3f}")
    print(f"  {'idle':<52}{per_job.get('idle', 0):6.3f}")
