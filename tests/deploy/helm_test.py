#!/usr/bin/env python3
"""Lints and renders helm/tandem with each values file of tests/deploy/values/ (and the
defaults), validates every rendered manifest against the Kubernetes JSON schemas (the
kubernetes-validate package, strict: unknown fields are errors) or, for the
prometheus-operator kinds, tests/deploy/schemas/, and checks what each values file is for.

lint also checks that the chart README's values table covers values.yaml.

Usage: helm_test.py lint|template REPO_ROOT HELM

Exits 77 (ctest skip) when helm or the schema package is missing: scripts/setup.sh
--deploy-tools installs both.
"""
import base64
import glob
import json
import os
import re
import subprocess
import sys

SKIP = 77
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
KUBE_VERSIONS = ["1.27.0", "1.35.0"]
RELEASE = "t"

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:
    print(f"SKIP: {e.name} is missing (scripts/setup.sh --deploy-tools installs it)")
    sys.exit(SKIP)


class Failures:
    def __init__(self):
        self.items = []

    def check(self, ok, message):
        if not ok:
            self.items.append(message)
        return ok


def helm(helm_bin, *args):
    return subprocess.run([helm_bin, *args], capture_output=True, text=True, check=False)


def values_files(root):
    files = sorted(glob.glob(os.path.join(root, "tests", "deploy", "values", "*.yaml")))
    return [("defaults", None)] + [(os.path.basename(f)[:-5], f) for f in files]


def render(helm_bin, chart, values, extra=()):
    args = ["template", RELEASE, chart, "--namespace", "serving", *extra]
    if values:
        args += ["-f", values]
    return helm(helm_bin, *args)


def find(docs, kind, suffix):
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"].endswith(suffix):
            return doc
    return None


def container(doc):
    return doc["spec"]["template"]["spec"]["containers"][0]


def args_of(doc):
    return container(doc)["args"]


def validate_schemas(docs, name, local_schemas, failures):
    for doc in docs:
        where = f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        schema = local_schemas.get((doc.get("apiVersion"), doc.get("kind")))
        if schema:
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
            failures.check(not errors, f"{where}: {[e.message for e in errors[:3]]}")
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.check(False, f"{where} (Kubernetes {version}): {e.message} at "
                                      f"{'/'.join(str(p) for p in e.path)}")
            except kubernetes_validate.SchemaNotFoundError:
                failures.check(False, f"{where}: no Kubernetes {version} schema for this kind")


def check_common(docs, name, chart, failures):
    """What every rendering must satisfy."""
    verifier = find(docs, "StatefulSet", "-verifier")
    router = find(docs, "Deployment", "-router")
    if not failures.check(verifier and router, f"{name}: no verifier StatefulSet or router"):
        return
    drain = [a for a in args_of(verifier) if a.startswith("--drain-seconds=")]
    grace = verifier["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    failures.check(len(drain) == 1 and grace > int(drain[0].split("=")[1]),
                   f"{name}: terminationGracePeriodSeconds {grace} does not cover {drain}")
    # Slow HTTP clients hold a thread each, for the request timeout at most.
    for flag in ("--http-max-connections=", "--http-request-timeout="):
        failures.check(any(a.startswith(flag) for a in args_of(router)),
                       f"{name}: the router lacks {flag}")
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet") or doc["metadata"]["name"].endswith(
                "-redis"):
            continue
        c = container(doc)
        tls = any(a.startswith("--tls-cert=") for a in c["args"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            kind = "tcpSocket" if tls else "grpc"
            failures.check(kind in c.get(probe, {}),
                           f"{name}: {doc['metadata']['name']} {probe} is not {kind}")
        failures.check(any(a.startswith("--metrics-listen=") for a in c["args"]),
                       f"{name}: {doc['metadata']['name']} has no --metrics-listen")
    # Single source of the dashboards: each ConfigMap carries a dashboards/*.json verbatim.
    dashboards = sorted(glob.glob(os.path.join(chart, "dashboards", "*.json")))
    maps = {k: v for doc in docs if doc["kind"] == "ConfigMap" for k, v in doc["data"].items()}
    for path in dashboards:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        failures.check(maps.get(os.path.basename(path), "").strip() == text.strip(),
                       f"{name}: the ConfigMap of {os.path.basename(path)} differs from the file")
        json.loads(maps.get(os.path.basename(path)) or "{}")


def gpu_limits(doc):
    return container(doc)["resources"].get("limits", {})


def check_specific(docs, name, failures):
    """What each values file is for."""
    verifier = find(docs, "StatefulSet", "-verifier")
    drafter = find(docs, "Deployment", "-drafter")
    router = find(docs, "Deployment", "-router")
    kinds = {doc["kind"] for doc in docs}
    if name == "cpu-only":
        for doc in (verifier, drafter):
            failures.check(not any("/" in k for k in gpu_limits(doc)),
                           f"{name}: {doc['metadata']['name']} requests accelerators")
            failures.check(not any(v["name"] == "models"
                                   for v in doc["spec"]["template"]["spec"]["volumes"]),
                           f"{name}: image-baked models still mount a volume")
        failures.check("PodMonitor" in kinds, f"{name}: no PodMonitor")
    elif name == "self-spec-split":
        args = args_of(drafter)
        failures.check("--mask-drafts=8" in args and "--branches=2" in args,
                       f"{name}: drafter args {args}")
    elif name == "one-gpu-per-pod":
        for doc in (verifier, drafter):
            failures.check(gpu_limits(doc).get("nvidia.com/gpu") == 1,
                           f"{name}: {doc['metadata']['name']} limits {gpu_limits(doc)}")
            failures.check(doc["spec"]["template"]["spec"].get("runtimeClassName") == "nvidia",
                           f"{name}: {doc['metadata']['name']} has no runtimeClassName")
        anti = drafter["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        term = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
        failures.check(term["labelSelector"]["matchLabels"].get(
            "app.kubernetes.io/component") == "verifier",
            f"{name}: drafters are not kept off the verifiers' nodes")
        failures.check(verifier["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
                       == 135, f"{name}: grace period does not follow drainSeconds 120")
        verifiers = [a for a in args_of(router) if a.startswith("--verifier=")]
        failures.check(len(verifiers) == 4 and verifiers[3].startswith(
            f"--verifier={RELEASE}-tandem-verifier-3.{RELEASE}-tandem-verifier-headless.serving"),
            f"{name}: router --verifier list {verifiers}")
        failures.check("ServiceMonitor" in kinds, f"{name}: no ServiceMonitor")
    elif name == "drafter-colocated":
        for doc in (verifier, drafter):
            failures.check(gpu_limits(doc).get("nvidia.com/mig-3g.40gb") == 1,
                           f"{name}: {doc['metadata']['name']} limits {gpu_limits(doc)}")
        spec = drafter["spec"]["template"]["spec"]
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        failures.check(term["topologyKey"] == "kubernetes.io/hostname" and
                       term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] ==
                       "verifier", f"{name}: drafter not placed with the verifiers")
        failures.check(drafter["spec"]["replicas"] == 3, f"{name}: not one drafter per verifier")
        service = find(docs, "Service", "-drafter")
        failures.check(service["spec"].get("internalTrafficPolicy") == "Local",
                       f"{name}: verifiers may reach another node's drafter")
        mount = [m for m in container(verifier)["volumeMounts"] if m["name"] == "models"]
        failures.check(mount and mount[0].get("subPath") == "tandem", f"{name}: PVC subPath")
    elif name == "tls-on":
        secret = find(docs, "Secret", "-tls")
        failures.check(secret and secret["type"] == "kubernetes.io/tls" and
                       b"BEGIN CERTIFICATE" in base64.b64decode(secret["data"]["ca.crt"]),
                       f"{name}: no TLS Secret with ca.crt")
        for doc in (router, verifier):
            for flag in ("--tls-client-ca=", "--client-tls-cert="):
                failures.check(any(a.startswith(flag) for a in args_of(doc)),
                               f"{name}: {doc['metadata']['name']} lacks {flag}")
        failures.check(any(a.startswith("--tls-client-ca=") for a in args_of(drafter)),
                       f"{name}: drafter does not require client certificates")
        redis = find(docs, "StatefulSet", "-redis")
        failures.check(redis is not None, f"{name}: no Redis")
        auth = find(docs, "Secret", "-redis-auth")
        failures.check(auth is not None and len(base64.b64decode(auth["data"]["password"])) >= 32,
                       f"{name}: no Redis password Secret")
        failures.check(redis is not None and "--requirepass" in args_of(redis),
                       f"{name}: the in-chart Redis does not require a password")
        # redis.tls: Redis serves TLS only and requires client certificates; every service
        # verifies it and presents its own.
        redis_args = args_of(redis) if redis is not None else []
        failures.check("--tls-port" in redis_args and "--tls-auth-clients" in redis_args and
                       redis_args[redis_args.index("--port") + 1] == "0",
                       f"{name}: the in-chart Redis does not serve TLS only: {redis_args}")
        for doc in (router, verifier, drafter):
            for flag in ("--redis-tls-ca=", "--redis-tls-cert=", "--redis-tls-key="):
                failures.check(any(a.startswith(flag) for a in args_of(doc)),
                               f"{name}: {doc['metadata']['name']} lacks {flag}")
        for doc in (router, verifier, drafter):
            failures.check("--redis-password-file=/etc/tandem/redis-auth/password" in
                           args_of(doc), f"{name}: {doc['metadata']['name']} does not AUTH")
        env = {e["name"]: e for e in container(router).get("env", [])}
        failures.check(env.get("TANDEM_ROUTER_API_KEYS", {}).get("valueFrom", {}).get(
            "secretKeyRef") == {"name": "tandem-api-keys", "key": "api-keys"},
            f"{name}: router does not read its API keys from the Secret")
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        failures.check(len(policies) == 4, f"{name}: expected 4 NetworkPolicies")
    elif name == "redis-external":
        failures.check(find(docs, "StatefulSet", "-redis") is None, f"{name}: Redis rendered")
        address = "redis-master.infra.svc.cluster.local:6379"
        for doc in (router, verifier):
            failures.check(f"--redis={address}" in args_of(doc), f"{name}: {doc['metadata']['name']}"
                           " does not use the external Redis")
        failures.check(not any(a.startswith("--verifier=") for a in args_of(router)),
                       f"{name}: router has a static --verifier list besides the registry")
        failures.check(router["spec"]["replicas"] == 3 and "HorizontalPodAutoscaler" not in kinds,
                       f"{name}: autoscaling off should give 3 fixed replicas")
        failures.check(drafter is None, f"{name}: drafter rendered although disabled")
        failures.check(not any(a.startswith("--redis-password-file") for a in args_of(router))
                       and find(docs, "Secret", "-redis-auth") is None,
                       f"{name}: AUTH to an external Redis without its Secret")
    elif name == "defaults":
        hpa = find(docs, "HorizontalPodAutoscaler", "-router")
        failures.check(hpa and hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] ==
                       "tandem_queue_depth", f"{name}: HPA not on tandem_queue_depth")
        failures.check("replicas" not in router["spec"], f"{name}: HPA and fixed replicas")
        pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        failures.check(len(pdbs) == 3, f"{name}: expected 3 PodDisruptionBudgets")


def leaf_keys(node, prefix=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaf_keys(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def check_readme(chart, failures):
    """The README's values table names every key of values.yaml (or a parent of it)."""
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    with open(os.path.join(chart, "README.md"), encoding="utf-8") as f:
        documented = set(re.findall(r"^\| `([\w.]+)` \| `", f.read(), re.M))
    for key in leaf_keys(values):
        parts = key.split(".")
        failures.check(any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1)),
                       f"README.md's values table lacks {key}")


def negative_checks(helm_bin, chart, failures):
    """The checks above must be able to fail."""
    result = render(helm_bin, chart, None, ["--set", "model.source=nfs"])
    failures.check(result.returncode != 0 and "model" in result.stderr,
                   "values.schema.json accepted model.source=nfs")
    result = render(helm_bin, chart, None, ["--set", "redis.mode=external"])
    failures.check(result.returncode != 0, "redis.mode=external without an address rendered")
    result = render(helm_bin, chart, None, ["--set", "redis.mode=internal",
                                            "--set", "redis.tls.enabled=true"])
    failures.check(result.returncode != 0 and "tls.enabled" in result.stderr,
                   "redis.tls.enabled without tls.enabled rendered")
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
               "metadata": {"labels": {"a": "b"}},
               "spec": {"containers": [{"name": "c", "image": "i", "startupProbes": {}}]}}}}
    try:
        kubernetes_validate.validate(bad, KUBE_VERSIONS[0], strict=True)
        failures.check(False, "the Kubernetes schema accepted a misspelt field (startupProbes)")
    except kubernetes_validate.ValidationError:
        pass


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("lint", "template"):
        raise SystemExit(__doc__)
    mode, root, helm_bin = sys.argv[1:]
    if not os.access(helm_bin, os.X_OK):
        print(f"SKIP: no helm at {helm_bin} (scripts/setup.sh --deploy-tools installs it)")
        return SKIP
    chart = os.path.join(root, "helm", "tandem")
    failures = Failures()
    local_schemas = {}
    for path in glob.glob(os.path.join(root, "tests", "deploy", "schemas", "*.json")):
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        local_schemas[(schema["properties"]["apiVersion"]["const"],
                       schema["properties"]["kind"]["const"])] = schema
    checked = 0
    for name, values in values_files(root):
        if mode == "lint":
            args = ["lint", "--strict", chart] + (["-f", values] if values else [])
            result = helm(helm_bin, *args)
            failures.check(result.returncode == 0, f"helm lint {name}:\n{result.stdout}"
                                                   f"{result.stderr}")
            checked += 1
            continue
        result = render(helm_bin, chart, values)
        if not failures.check(result.returncode == 0, f"helm template {name}: {result.stderr}"):
            continue
        docs = [d for d in yaml.safe_load_all(result.stdout) if d]
        checked += len(docs)
        validate_schemas(docs, name, local_schemas, failures)
        check_common(docs, name, chart, failures)
        check_specific(docs, name, failures)
    if mode == "template":
        negative_checks(helm_bin, chart, failures)
    else:
        check_readme(chart, failures)
    for item in failures.items:
        print(f"FAIL: {item}")
    what = "values files linted" if mode == "lint" else "manifests validated"
    print(f"{checked} {what}; {len(failures.items)} failures")
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
