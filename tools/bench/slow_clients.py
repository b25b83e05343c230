#!/usr/bin/env python3
"""Slow HTTP clients against a running router: do they block the API, and are they closed?

Opens --connections connections to the router's HTTP port, each sending an endless request
header one byte every --interval seconds (under the server's timeout between two reads, so only
a total request deadline ends them). Meanwhile, once a second, times GET /health and a short
POST /v1/completions on connections of their own. Prints a table: the slow connections the
router closed (and after how long), and the probes' latencies and failures.

  tandem up &   # with e.g. TANDEM_ROUTER_HTTP_MAX_CONNECTIONS=64 in its environment
  python3 tools/bench/slow_clients.py --http 127.0.0.1:8471 --connections 100 --duration 30

Standard library only.
"""

import argparse
import http.client
import json
import select
import socket
import statistics
import threading
import time


def probe(host, port, method, path, body, timeout):
    """Seconds the request took, or None when it failed or timed out."""
    start = time.monotonic()
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        headers = {"Content-Type": "application/json"} if body else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            return None
    except (OSError, http.client.HTTPException):
        return None
    return time.monotonic() - start


def trickle(host, port, count, interval, duration, closed_after):
    """Keeps `count` connections trickling a header; records when the server closed each."""
    start = time.monotonic()
    open_sockets = {}
    for i in range(count):
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.setblocking(False)
        open_sockets[sock] = i
    while open_sockets and time.monotonic() - start < duration:
        readable, _, _ = select.select(list(open_sockets), [], [], interval)
        gone = set(readable)  # the server sends nothing before a whole request: closed
        for sock in list(open_sockets):
            if sock in gone:
                continue
            try:
                sock.send(b"a")
            except OSError:
                gone.add(sock)
        for sock in gone:
            closed_after.append(time.monotonic() - start)
            del open_sockets[sock]
            sock.close()
    for sock in open_sockets:
        sock.close()


def summary(values):
    if not values:
        return "-"
    return (f"min {min(values):.2f} s, p50 {statistics.median(values):.2f} s, "
            f"max {max(values):.2f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http", default="127.0.0.1:8471", help="the router's HTTP host:port")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between bytes")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--probe-timeout", type=float, default=30.0)
    args = parser.parse_args()
    host, port = args.http.rsplit(":", 1)
    port = int(port)

    closed_after = []
    slow = threading.Thread(target=trickle, args=(host, port, args.connections, args.interval,
                                                  args.duration, closed_after))
    slow.start()
    time.sleep(1.0)  # every slow connection accepted
    health, completion, failed = [], [], {"health": 0, "completion": 0}
    body = json.dumps({"prompt": "Hello", "max_tokens": 4})
    start = time.monotonic()
    while time.monotonic() - start < args.duration - 1.0:
        tick = time.monotonic()
        for name, method, path, payload, out in (("health", "GET", "/health", None, health),
                                                 ("completion", "POST", "/v1/completions", body,
                                                  completion)):
            seconds = probe(host, port, method, path, payload, args.probe_timeout)
            if seconds is None:
                failed[name] += 1
            else:
                out.append(seconds)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    slow.join()

    print(f"| slow connections | closed by the router | closed after | "
          f"/health | /health failed | completion | completion failed |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.connections} (a byte per {args.interval:g} s, {args.duration:g} s) | "
          f"{len(closed_after)} | {summary(closed_after)} | {summary(health)} | "
          f"{failed['health']} of {len(health) + failed['health']} | {summary(completion)} | "
          f"{failed['completion']} of {len(completion) + failed['completion']} |")


if __name__ == "__main__":
    main()
