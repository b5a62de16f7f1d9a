"""deploy/kubernetes/: yamllint passes, and every flag, port and path the
manifests use is one the opserver binary has (its --helpfull) and
docs/server-flags.md documents, and they agree with each other: the probes
on the --health_listen port, the Prometheus annotation on --metrics_listen's,
the Service on the container's ports, the file flags under mounted
volumes, one NPU resource per --device entry, and a grace period above the
drain. No cluster runs here.

    kubernetes_manifests_test.py OPSERVER_BINARY SERVER_FLAGS_MD POOL_MD \
        DAEMONSET_YAML SERVICE_YAML
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

BINARY = FLAGS_MD = POOL_MD = DAEMONSET = SERVICE = None


def load(path):
    with open(path, encoding="utf-8") as f:
        return list(yaml.safe_load_all(f))


def port_of(address):
    return int(address.rsplit(":", 1)[1])


class ManifestsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        (cls.daemonset,) = load(DAEMONSET)
        (cls.service,) = load(SERVICE)
        cls.pod = cls.daemonset["spec"]["template"]
        (cls.container,) = cls.pod["spec"]["containers"]
        cls.args = {}
        for arg in cls.container["args"]:
            name, _, value = arg.partition("=")
            cls.args[name] = value
        cls.helpfull = subprocess.run(
            [BINARY, "--helpfull"], capture_output=True, text=True,
            timeout=60).stdout
        with open(FLAGS_MD, encoding="utf-8") as f:
            cls.flags_md = f.read()

    def test_yamllint_passes(self):
        yamllint = shutil.which("yamllint")
        self.assertIsNotNone(
            yamllint, "yamllint is missing (scripts/install-deps.sh)")
        result = subprocess.run([yamllint, "-s", DAEMONSET, SERVICE],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_every_flag_is_the_binarys_and_documented(self):
        self.assertGreater(len(self.args), 5)
        for name in self.args:
            self.assertTrue(name.startswith("--"), name)
            self.assertIn("    %s (" % name, self.helpfull,
                          "%s is not a flag of %s" % (name, BINARY))
            self.assertRegex(self.flags_md, r"`%s`" % re.escape(name),
                             "%s is not in docs/server-flags.md" % name)

    def container_port(self, name):
        for port in self.container["ports"]:
            if port["name"] == name:
                return port["containerPort"]
        self.fail("no container port named %s" % name)

    def test_ports_agree_with_the_flags(self):
        self.assertEqual(port_of(self.args["--listen"]),
                         self.container_port("grpc"))
        health = port_of(self.args["--health_listen"])
        self.assertEqual(health, self.container_port("health"))
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertEqual(self.container[probe]["grpc"]["port"], health,
                             probe)
        metrics = port_of(self.args["--metrics_listen"])
        self.assertEqual(metrics, self.container_port("metrics"))
        annotations = self.pod["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(int(annotations["prometheus.io/port"]), metrics)
        self.assertEqual(annotations["prometheus.io/path"], "/metrics")

    def test_the_service_is_headless_over_the_pods_ports(self):
        spec = self.service["spec"]
        self.assertEqual(spec["clusterIP"], "None")
        labels = self.pod["metadata"]["labels"]
        for key, value in spec["selector"].items():
            self.assertEqual(labels.get(key), value)
        for port in spec["ports"]:
            self.assertEqual(port["port"],
                             self.container_port(port["targetPort"]))

    def test_file_flags_are_under_mounted_secrets(self):
        mounts = {m["mountPath"]: m["name"]
                  for m in self.container["volumeMounts"]}
        volumes = {v["name"]: v for v in self.pod["spec"]["volumes"]}
        for name in ("--tls_cert_file", "--tls_key_file",
                     "--auth_token_file"):
            path = self.args[name]
            directory = os.path.dirname(path)
            self.assertIn(directory, mounts, "%s=%s" % (name, path))
            self.assertIn("secret", volumes[mounts[directory]], name)
        for volume in mounts.values():
            self.assertIn(volume, volumes)
        self.assertEqual(
            volumes[mounts["/usr/local/Ascend/driver"]]["hostPath"]["path"],
            "/usr/local/Ascend/driver")

    def test_one_npu_resource_per_device(self):
        kind, _, devices = self.args["--device"].partition(":")
        self.assertEqual(kind, "ascend")
        limits = self.container["resources"]["limits"]
        self.assertEqual(limits["huawei.com/Ascend910"],
                         len(devices.split(",")))

    def test_the_grace_period_covers_the_drain(self):
        drain = int(self.args["--drain_s"])
        grace = int(self.args["--shutdown_grace_ms"]) / 1000
        self.assertGreater(drain, 0)
        self.assertGreater(self.pod["spec"]["terminationGracePeriodSeconds"],
                           drain + grace)

    def test_the_docs_name_the_manifests(self):
        with open(POOL_MD, encoding="utf-8") as f:
            pool = f.read()
        for path in (DAEMONSET, SERVICE):
            self.assertIn("deploy/kubernetes/" + os.path.basename(path), pool)
        self.assertIn("No cluster", pool)


if __name__ == "__main__":
    BINARY, FLAGS_MD, POOL_MD, DAEMONSET, SERVICE = sys.argv[1:6]
    del sys.argv[1:6]
    unittest.main()
