#!/usr/bin/env python3
"""A real Prometheus scrapes a `tandem up` cluster: every metrics endpoint the cluster
announces is scraped healthy, the rules of deploy/prometheus/rules load and evaluate, every
dashboard query runs, each service exports tandem_build_info, and the unlabelled metrics of
docs/METRICS.md are exported.

Usage: prometheus_scrape_test.py TANDEM_BINARY REPO_ROOT

Exits 77 (skip) without the Debian prometheus server, or when `tandem up` announces no
metrics endpoints (lines "<binary> metrics on HOST:PORT").
"""
import json
import os
import re
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import metric_names_test  # noqa: E402  (dashboard parsing and the METRICS.md table)

SKIP = 77
START_TIMEOUT = 120  # model load of the bundled model, with margin for a loaded machine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reader(proc):
    """A queue receiving proc's stdout lines (None at EOF), filled by a daemon thread."""
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def read_until(lines, deadline, done):
    """Lines from the queue until done(lines read), EOF or the deadline."""
    read = []
    while not done(read):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            break
        read.append(line)
    return read


def api(port, path, **params):
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def stop(proc):
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    tandem, root = sys.argv[1], sys.argv[2]
    if not os.access(tandem, os.X_OK):
        print(f"FAIL: {tandem} is not built")
        return 1
    prometheus_bin = shutil.which("prometheus")
    if not prometheus_bin:
        print("SKIP: no prometheus server (Debian package prometheus)")
        return SKIP
    cluster = prometheus = None
    work = tempfile.mkdtemp(prefix="tandem-scrape-")
    failures = []
    try:
        cluster = subprocess.Popen(
            [tandem, "up", "--model", os.path.join(root, "models", "tandem-target"),
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        output = start_reader(cluster)
        started = lambda lines: any("listening on" in l for l in lines)  # noqa: E731
        lines = read_until(output, time.monotonic() + START_TIMEOUT, started)
        if not started(lines):
            print("\n".join(lines))
            print(f"FAIL: tandem up did not start within {START_TIMEOUT} s "
                  f"(exit status {cluster.poll()})")
            return 1
        lines += read_until(output, time.monotonic() + 2, lambda _: False)
        endpoints = sorted({m.group(1) for l in lines
                            for m in [re.search(r"metrics(?: on |\s+http://)(\S+?:\d+)", l)] if m})
        if not endpoints:
            print("SKIP: tandem up announces no metrics endpoints yet")
            return SKIP

        rules = os.path.join(root, "deploy", "prometheus", "rules", "tandem.rules.yml")
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as f:
            json.dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                       "rule_files": [rules],
                       "scrape_configs": [{"job_name": "tandem",
                                           "static_configs": [{"targets": endpoints}]}]}, f)
        port = free_port()
        prometheus = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"))

        deadline = time.monotonic() + 60
        health = {}
        while time.monotonic() < deadline:
            try:
                targets = api(port, "targets")["data"]["activeTargets"]
                health = {t["scrapeUrl"]: t["health"] for t in targets}
                if len(health) == len(endpoints) and all(h == "up" for h in health.values()):
                    break
            except OSError:
                pass
            time.sleep(1)
        if len(health) != len(endpoints) or not all(h == "up" for h in health.values()):
            failures.append(f"targets not all up after 60 s: {health}")
        time.sleep(3)  # a few scrapes and rule evaluations

        services = {r["metric"].get("service") for r in
                    api(port, "query", query="tandem_build_info")["data"]["result"]}
        if services != {"router", "verifier", "drafter"}:
            failures.append(f"tandem_build_info comes from {sorted(services)}, not from the "
                            "router, the verifier and the drafter")

        exported = set(api(port, "label/__name__/values")["data"])
        contract = metric_names_test.load_contract(os.path.join(root, "docs", "METRICS.md"))
        for name, (kind, labels) in sorted(contract.items()):
            series = f"{name}_count" if kind == "histogram" else name
            if not labels and series not in exported:
                failures.append(f"{name} (no labels besides service) is not exported")

        for path in sorted(os.listdir(os.path.join(root, "helm", "tandem", "dashboards"))):
            for where, expr in metric_names_test.dashboard_exprs(
                    os.path.join(root, "helm", "tandem", "dashboards", path)):
                query = re.sub(r"\$__rate_interval", "1m", expr).replace("$mode", ".*")
                try:
                    status = api(port, "query", query=query)["status"]
                except OSError as e:
                    status = str(e)
                if status != "success":
                    failures.append(f"{where}: {query}: {status}")
        groups = api(port, "rules")["data"]["groups"]
        unhealthy = [r["name"] for g in groups for r in g["rules"] if r.get("health") == "err"]
        if not groups or unhealthy:
            failures.append(f"rules not loaded or failing: {unhealthy}")
    finally:
        stop(prometheus)
        if cluster and cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGINT)
            try:
                cluster.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(cluster.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"scrape test: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
