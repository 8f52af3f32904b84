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
