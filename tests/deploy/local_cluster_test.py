#!/usr/bin/env python3
"""Checks that the single-host cluster of deploy/ fits together: compose.yaml's services call
each other at the addresses they listen on, Prometheus scrapes every service's metrics port,
Grafana loads the chart's dashboards, the images build the binaries that CMake defines, and
compose and the chart use the same ports.

Usage: local_cluster_test.py REPO_ROOT
"""
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is missing (scripts/setup.sh --deploy-tools installs it)")
    sys.exit(77)

TANDEM = {"router": "tandem-router", "verifier": "tandem-verifier", "drafter": "tandem-drafter"}


def default_of(text):
    """Compose's ${VAR:-default} substitution, with every variable at its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def flags(command):
    out = {}
    for arg in command[1:]:
        key, _, value = default_of(arg).partition("=")
        out.setdefault(key, []).append(value)
    return out


def main():
    root = sys.argv[1]
    deploy = os.path.join(root, "deploy")
    problems = []

    def check(ok, message):
        if not ok:
            problems.append(message)

    with open(os.path.join(deploy, "compose.yaml"), encoding="utf-8") as f:
        compose = yaml.safe_load(f)
    services = compose["services"]
    for name in ("redis", "router", "verifier", "drafter", "prometheus", "grafana"):
        check(name in services, f"compose.yaml has no {name} service")

    listen, metrics = {}, {}
    for name, binary in TANDEM.items():
        command = services[name]["command"]
        check(command[0] == binary, f"{name} runs {command[0]}, not {binary}")
        f = flags(command)
        listen[name] = f["--listen"][0].rsplit(":", 1)[1]
        metrics[name] = f.get("--metrics-listen", ["none:none"])[0].rsplit(":", 1)[1]
        check(f.get("--redis") == ["redis:6379"], f"{name} does not register with redis:6379")
        if name != "router":
            check(f.get("--advertise") == [f"{name}:{listen[name]}"],
                  f"{name} advertises {f.get('--advertise')}, listens on {listen[name]}")
            model = f["--model"][0]
            check(model.startswith("/models/") and os.path.isdir(
                os.path.join(root, "models", model[len("/models/"):])),
                f"{name} model {model} is not under models/")
    verifier = flags(services["verifier"]["command"])
    router = flags(services["router"]["command"])
    check(verifier.get("--drafter") == [f"drafter:{listen['drafter']}"],
          f"verifier --drafter {verifier.get('--drafter')} is not the drafter's address")

    # Prometheus scrapes exactly the services' metrics ports.
    with open(os.path.join(deploy, "prometheus", "prometheus.yml"), encoding="utf-8") as f:
        prometheus = yaml.safe_load(f)
    targets = {t for job in prometheus["scrape_configs"] if job["job_name"] == "tandem"
               for static in job["static_configs"] for t in static["targets"]}
    wanted = {f"{name}:{metrics[name]}" for name in TANDEM}
    check(targets == wanted, f"Prometheus scrapes {sorted(targets)}, services serve metrics on "
                             f"{sorted(wanted)}")
    for rule_file in prometheus["rule_files"]:
        check(os.path.isfile(os.path.join(deploy, "prometheus", rule_file)),
              f"prometheus.yml names a missing rule file {rule_file}")
    mounts = [v.split(":") for v in services["prometheus"]["volumes"]]
    check(["./prometheus", "/etc/prometheus", "ro"] in mounts, "Prometheus config not mounted")

    # Grafana: the chart's dashboards, at the path its provisioning reads.
    with open(os.path.join(deploy, "grafana", "provisioning", "dashboards", "tandem.yml"),
              encoding="utf-8") as f:
        provider_path = yaml.safe_load(f)["providers"][0]["options"]["path"]
    grafana_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    source = grafana_mounts.get(provider_path, "")
    dashboards = os.path.normpath(os.path.join(deploy, source))
    check(dashboards == os.path.join(root, "helm", "tandem", "dashboards") and
          any(n.endswith(".json") for n in os.listdir(dashboards)),
          f"Grafana reads {provider_path} from {source}, not the chart's dashboards")

    # Images: build the binaries CMake defines, from where CMake puts them.
    executables = {}
    for name in ("cli", "router", "verifier", "drafter"):
        with open(os.path.join(root, "services", name, "CMakeLists.txt"), encoding="utf-8") as f:
            m = re.search(r"add_executable\(([\w-]+)", f.read())
        executables[m.group(1)] = f"/build/services/{name}/{m.group(1)}"
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
        with open(os.path.join(deploy, "docker", dockerfile), encoding="utf-8") as f:
            text = f.read()
        for binary, path in executables.items():
            check(path in text and re.search(rf"--target [^\n]*\b{binary}\b", text),
                  f"{dockerfile} does not build and install {binary} ({path})")
        for stage in ("build", "runtime", "with-models"):
            check(re.search(rf"^FROM .* AS {stage}$", text, re.M), f"{dockerfile}: no {stage}")
    for overlay in ("compose.yaml", "compose.gpu.yaml"):
        with open(os.path.join(deploy, overlay), encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        for key, value in list(doc.items()) + list(doc.get("services", {}).items()):
            build = value.get("build") if isinstance(value, dict) else None
            if build:
                check(os.path.isfile(os.path.join(deploy, build["context"], build["dockerfile"])),
                      f"{overlay}: {key} builds a missing {build['dockerfile']}")

    # Compose and the chart agree on ports.
    with open(os.path.join(root, "helm", "tandem", "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    for name in TANDEM:
        check(int(listen[name]) == values[name]["grpcPort"],
              f"{name}: compose listens on {listen[name]}, the chart on {values[name]['grpcPort']}")
        check(int(metrics[name]) == values["metrics"]["port"], f"{name}: metrics port differs")
    check(router["--http-listen"][0].endswith(f":{values['router']['httpPort']}"),
          "router HTTP port differs between compose and the chart")

    for problem in problems:
        print(f"FAIL: {problem}")
    print(f"local cluster description: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
