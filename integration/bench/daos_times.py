"""What the two DAOS lifecycle benchmarks read the same way (imported by
the Python parts of daos-lifecycle.sh and daos-lifecycle-sequential.sh)."""
import datetime as dt

# daos-sim's SIGTERM flag poll (server.rs / agent.rs main loops): counted
# at this bound as a simulator wait.
POLL = 0.05


def ts(s):
    """RFC 3339 UTC with up to 9 decimals → epoch seconds."""
    s = s.rstrip("Z").split("+")[0]
    head, _, frac = s.partition(".")
    t = dt.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return t + float("0." + frac) if frac else t
