"""The hostile side and the measuring side of hostile-clients.sh.

  python3 hostile_clients.py swarm SOCKET JOB N SECONDS   (as the hostile uid)
  python3 hostile_clients.py measure GPUQ SAMPLES          (as another uid)
  python3 hostile_clients.py stats SOCKET                  (as root)

swarm: N connections at once, by i % 5: idle (connect, send nothing),
slow (a request head one byte a second), list (GET /v1/jobs on a
keep-alive connection, again 50 ms after each answer), submit (POST
`true` jobs, again 50 ms after each answer), follow (the running job's
log; every other one never reads). Whatever the broker closes or refuses
is opened again 200 ms later. Prints what it saw as JSON.
"""
import asyncio, json, os, socket, subprocess, sys, time

PAUSE, BACKOFF = 0.05, 0.2
LIST = b"GET /v1/jobs HTTP/1.1\r\nhost: x\r\n\r\n"
SUBMIT_BODY = json.dumps({"argv": ["true"], "cwd": "/tmp", "env": []}).encode()
SUBMIT = (b"POST /v1/jobs HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
          b"content-length: %d\r\n\r\n" % len(SUBMIT_BODY)) + SUBMIT_BODY


async def read_answer(r):
    """One HTTP answer (content-length bodies only); returns the status."""
    head = await r.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    n = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
    if n:
        await r.readexactly(n)
    return status


async def client(i, sock, job, seen, stop):
    kind = ["idle", "slow", "list", "submit", "follow"][i % 5]
    while time.monotonic() < stop:
        try:
            r, w = await asyncio.open_unix_connection(sock)
        except OSError as e:
            seen["connect_error " + e.__class__.__name__] = seen.get("connect_error " + e.__class__.__name__, 0) + 1
            await asyncio.sleep(BACKOFF)
            continue
        seen["connects"] += 1
        try:
            if kind == "idle":
                d = await r.read(65536)
                if d.startswith(b"HTTP/1.1 4") or d.startswith(b"HTTP/1.1 5"):
                    seen["refused " + d[9:12].decode()] = seen.get("refused " + d[9:12].decode(), 0) + 1
                else:
                    seen["idle closed"] += 1
            elif kind == "slow":
                for b in b"GET /v1/jobs HTTP/1.1\r\nhost: x\r\n":
                    w.write(bytes([b]))
                    await w.drain()
                    await asyncio.sleep(1)
                seen["slow survived"] += 1
            elif kind in ("list", "submit"):
                req = LIST if kind == "list" else SUBMIT
                while time.monotonic() < stop:
                    w.write(req)
                    await w.drain()
                    st = await read_answer(r)
                    key = f"{kind} {st}"
                    seen[key] = seen.get(key, 0) + 1
                    if st >= 400 and st != 429 or st in (503,):
                        break
                    if st == 429 and kind == "list":
                        break  # a refused connection is closed by the broker
                    await asyncio.sleep(PAUSE)
            else:
                w.write(b"GET /v1/jobs/%d/log?follow=1 HTTP/1.1\r\nhost: x\r\n\r\n" % job)
                await w.drain()
                head = await r.readuntil(b"\r\n\r\n")
                st = head[9:12].decode()
                seen[f"follow {st}"] = seen.get(f"follow {st}", 0) + 1
                if st == "200":
                    if i % 2:
                        await asyncio.sleep(stop - time.monotonic())   # never reads
                    else:
                        while time.monotonic() < stop and await r.read(4096):
                            await asyncio.sleep(1)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            seen["closed by broker"] += 1
        finally:
            w.close()
        await asyncio.sleep(BACKOFF)


async def swarm(sock, job, n, secs):
    seen = {"connects": 0, "idle closed": 0, "slow survived": 0, "closed by broker": 0}
    stop = time.monotonic() + secs
    await asyncio.gather(*(client(i, sock, job, seen, stop) for i in range(n)))
    print(json.dumps(seen, sort_keys=True))


def measure(gpuq, samples):
    times, failed = [], 0
    for _ in range(samples):
        t0 = time.perf_counter()
        p = subprocess.run([gpuq, "list"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append((time.perf_counter() - t0) * 1000)
        if p.returncode != 0:
            failed += 1
            sys.stderr.write(p.stderr.decode())
        time.sleep(0.02)
    times.sort()
    q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
    print(json.dumps({"samples": samples, "failed": failed, "p50_ms": round(q(0.5), 2),
                      "p99_ms": round(q(0.99), 2), "max_ms": round(times[-1], 2)}))


def stats(sock):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall(b"GET /v1/stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        out += d
    print(out.split(b"\r\n\r\n", 1)[1].decode())


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "swarm":
        asyncio.run(swarm(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])))
    elif mode == "measure":
        measure(sys.argv[2], int(sys.argv[3]))
    else:
        stats(sys.argv[2])
