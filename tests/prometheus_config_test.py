"""docs/prometheus.yml and docs/opserver-alerts.yml: valid YAML of the shape
Prometheus reads, and every metric their rules name is one a live opserver
exports.

    prometheus_config_test.py OPSERVER_BINARY
"""

import os
import re
import sys
import unittest
import urllib.request

import testing

testing.prepare()

import yaml  # noqa: E402

import opserver  # noqa: E402

BINARY = None
DOCS = "docs"
# PromQL words that are not metric names.
PROMQL = {"sum", "by", "rate", "histogram_quantile", "le", "instance",
          "up", "job", "grpc_method", "grpc_status", "op", "aclnn_status",
          "device", "and", "or", "unless", "without", "on", "ignoring"}


def load(name):
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return yaml.safe_load(f)


def rules():
    return [rule for group in load("opserver-alerts.yml")["groups"]
            for rule in group["rules"]]


def metric_names(expr):
    """The metric names an expression reads: identifiers outside label
    matchers and strings, less PromQL's own words and label names."""
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r'"[^"]*"', "", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n not in PROMQL}


def exported(page):
    """Metric names on a /metrics page, histogram series under their
    family's name too."""
    names = set()
    for line in page.splitlines():
        m = re.match(r"# TYPE (\S+) ", line) or re.match(r"([a-zA-Z_:]\w*)",
                                                         line)
        if m:
            names.add(m.group(1))
    return names


class PrometheusConfigTest(unittest.TestCase):

    def test_the_config_has_prometheus_shape(self):
        config = load("prometheus.yml")
        self.assertEqual(config["rule_files"], ["opserver-alerts.yml"])
        jobs = config["scrape_configs"]
        self.assertEqual([j["job_name"] for j in jobs], ["opserver"])
        self.assertEqual(jobs[0]["metrics_path"], "/metrics")
        for target in jobs[0]["static_configs"][0]["targets"]:
            self.assertRegex(target, r"^[\w.-]+:\d+$")

    def test_every_rule_is_complete(self):
        names = [r["alert"] for r in rules()]
        self.assertEqual(len(names), len(set(names)))
        self.assertGreaterEqual(len(names), 4)
        for rule in rules():
            self.assertEqual(set(rule), {"alert", "expr", "for", "labels",
                                         "annotations"}, rule["alert"])
            self.assertRegex(rule["for"], r"^\d+[smh]$")
            self.assertIn(rule["labels"]["severity"], ("page", "ticket"))
            self.assertTrue(rule["annotations"]["summary"])

    def test_every_metric_named_is_exported(self):
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0") as server:
            # Some work, so the labelled families have series.
            client = opserver.connect(server.address)
            with client.session("prometheus_config_test") as s:
                import numpy as np
                s.threshold_backward(np.ones(4, np.float32),
                                     np.ones(4, np.float32), 0.5)
            url = "http://%s/metrics" % server.metrics_address
            with urllib.request.urlopen(url, timeout=30) as r:
                page = r.read().decode()
        names = exported(page)
        used = set()
        for rule in rules():
            used |= metric_names(rule["expr"])
        self.assertIn("opserver_device_memory_free_bytes", used)
        for name in sorted(used):
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            self.assertTrue(name in names or family in names,
                            "%s is not on the server's /metrics page" % name)


if __name__ == "__main__":
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main()
