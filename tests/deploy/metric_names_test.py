#!/usr/bin/env python3
"""Every metric and label that a Grafana dashboard, a Prometheus rule or the chart's autoscaler
queries is in the contract table of docs/METRICS.md.

Usage: metric_names_test.py REPO_ROOT

Expressions come from helm/tandem/dashboards/*.json (panel targets and template variables)
and deploy/prometheus/rules/*.yml; names with a colon must be recording rules defined there.
Histogram series may carry _bucket, _sum and _count. The test first runs the checker on
deliberately misspelt expressions and fails if it does not catch them.
"""
import glob
import json
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is missing (scripts/setup.sh --deploy-tools installs it)")
    sys.exit(77)

# Labels every series may carry besides those of the table: the contract's `service`, the
# histogram bucket bound, and the target labels Prometheus and the scrape configs attach.
COMMON_LABELS = {"service", "le", "instance", "job", "component", "__name__"}

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless", "inf", "nan", "atan2"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-zA-Z]*|0x[0-9a-fA-F]+)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){}\[\],@])
  | (?P<space>\s+)
""", re.VERBOSE)


def load_contract(metrics_md):
    """{name: (type, {labels})} from the markdown table of docs/METRICS.md."""
    contract = {}
    row = re.compile(r"^\|\s*`(tandem_[a-z0-9_]+)`\s*\|\s*(\w+)\s*\|([^|]*)\|")
    with open(metrics_md, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if m:
                labels = set(re.findall(r"`([a-z_]+)`", m.group(3)))
                contract[m.group(1)] = (m.group(2), labels)
    if not contract:
        raise SystemExit(f"no metric table found in {metrics_md}")
    return contract


def tokenize(expr):
    # Grafana variables ($__rate_interval, $mode, ${datasource}) stand for durations or
    # label values: a duration literal keeps the expression well formed.
    expr = re.sub(r"\$\{\w+(?::\w+)?\}|\$\w+", "1m", expr)
    pos, tokens = 0, []
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    return tokens


def names_in(expr):
    """(metric names, label names) an expression refers to."""
    tokens = tokenize(expr)
    metrics, labels = [], []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if text == "{":
            # Label matchers: name op "value" [, ...] }
            i += 1
            while i < len(tokens) and tokens[i][1] != "}":
                if tokens[i][0] == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "op" \
                        and tokens[i + 1][1] in ("=", "!=", "=~", "!~"):
                    labels.append(tokens[i][1])
                i += 1
        elif text == "[":
            while i < len(tokens) and tokens[i][1] != "]":
                i += 1
        elif kind == "name" and text in GROUPING:
            if nxt == "(":
                i += 2
                while i < len(tokens) and tokens[i][1] != ")":
                    if tokens[i][0] == "name":
                        labels.append(tokens[i][1])
                    i += 1
        elif kind == "name" and nxt == "(" or text in AGGREGATIONS or text in KEYWORDS:
            pass  # a function call, an aggregation or a keyword
        elif kind == "name":
            metrics.append(text)
        i += 1
    return metrics, labels


def check_expr(expr, contract, recorded, where):
    """Error messages for the names in `expr` that the contract does not have."""
    errors = []
    try:
        metrics, labels = names_in(expr)
    except ValueError as e:
        return [f"{where}: {e}"]
    allowed_labels = set(COMMON_LABELS)
    for name in metrics:
        if ":" in name:
            if name not in recorded:
                errors.append(f"{where}: '{name}' is no recording rule of deploy/prometheus/rules")
            continue
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and contract.get(name[: -len(suffix)], ("",))[0] == "histogram":
                base = name[: -len(suffix)]
        if base not in contract:
            errors.append(f"{where}: metric '{name}' is not in docs/METRICS.md")
        elif contract[base][0] == "histogram" and base == name:
            errors.append(f"{where}: '{name}' is a histogram; query _bucket, _sum or _count")
        else:
            allowed_labels |= contract[base][1]
    if not metrics or any(":" in m for m in metrics):
        # Recording rules carry their sources' labels; without a metric, anything goes.
        allowed_labels |= set().union(*(labels for _, labels in contract.values()))
    for label in labels:
        if label not in allowed_labels:
            errors.append(f"{where}: label '{label}' is not a label of {sorted(set(metrics))} "
                          f"in docs/METRICS.md")
    return errors


def dashboard_exprs(path):
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    found = []

    def walk_panels(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if isinstance(target.get("expr"), str):
                    found.append((f"panel '{panel.get('title')}' {target.get('refId', '')}",
                                  target["expr"]))
            walk_panels(panel.get("panels", []))  # panels inside a collapsed row

    walk_panels(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        where = f"variable ${var['name']}"
        label_values = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
        query_result = re.fullmatch(r"\s*query_result\((.*)\)\s*", query)
        if label_values:
            found.append((where, f"sum by ({label_values.group(2)}) ({label_values.group(1)})"))
        elif query_result:
            found.append((where, query_result.group(1)))
        elif not re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*|\s*label_names\(\)\s*", query):
            found.append((where, query))
    return [(f"{os.path.basename(path)}: {w}", e) for w, e in found]


def rule_exprs(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    found, recorded = [], set()
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("record") or rule.get("alert")
            found.append((f"{os.path.basename(path)}: {name}", rule["expr"]))
            if "record" in rule:
                recorded.add(rule["record"])
    return found, recorded


def self_test(contract, recorded):
    """The checker must reject misspellings; returns the failures of that check."""
    must_fail = [
        "sum(rate(tandem_generated_token_total[5m]))",           # metric misspelt
        "histogram_quantile(0.99, sum by (le) (rate(tandem_time_to_first_token_bucket[5m])))",
        "tandem_queue_depth_bucket",                             # gauge has no buckets
        "tandem_time_to_first_token_seconds",                    # bare histogram name
        "sum by (mdoe) (rate(tandem_requests_total[5m]))",       # label misspelt
        'tandem_worker_up{rol="verifier"}',                      # matcher label misspelt
        "tandem:acceptance_rate:ratio_rate1h",                   # no such recording rule
    ]
    must_pass = [
        'histogram_quantile(0.99, sum by (le, mode) (rate('
        'tandem_time_to_first_token_seconds_bucket{service="router", mode=~"$mode"}'
        '[$__rate_interval])))',
        "sum by (position) (rate(tandem_accepted_position_total[5m])) / ignoring (position) "
        "group_left sum(rate(tandem_drafts_total[5m]))",
    ]
    problems = []
    for expr in must_fail:
        if not check_expr(expr, contract, recorded, "self-test"):
            problems.append(f"checker accepted the misspelt expression: {expr}")
    for expr in must_pass:
        errors = check_expr(expr, contract, recorded, "self-test")
        if errors:
            problems.append(f"checker rejected a valid expression: {errors}")
    return problems


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    root = sys.argv[1]
    contract = load_contract(os.path.join(root, "docs", "METRICS.md"))
    exprs, recorded = [], set()
    for path in sorted(glob.glob(os.path.join(root, "deploy", "prometheus", "rules", "*.yml"))):
        found, names = rule_exprs(path)
        exprs += found
        recorded |= names
    dashboards = sorted(glob.glob(os.path.join(root, "helm", "tandem", "dashboards", "*.json")))
    for path in dashboards:
        exprs += dashboard_exprs(path)
    with open(os.path.join(root, "helm", "tandem", "values.yaml"), encoding="utf-8") as f:
        hpa_metric = yaml.safe_load(f)["router"]["autoscaling"]["metricName"]
    exprs.append(("helm/tandem/values.yaml: router.autoscaling.metricName", hpa_metric))

    problems = self_test(contract, recorded)
    if not dashboards or not recorded:
        problems.append("found no dashboards or no recording rules to check")
    for where, expr in exprs:
        problems += check_expr(expr, contract, recorded, where)
    for problem in problems:
        print(problem)
    print(f"{len(exprs)} expressions checked against {len(contract)} metrics of docs/METRICS.md; "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
