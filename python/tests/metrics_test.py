"""/metrics of a live opserver (--metrics_listen), read with the Prometheus
client's own parser before and after known work: each counter and
histogram count moves by exactly what the work did, a refused plan is
counted under its aclnn status, and the scrape-time gauges show the
session's tenant and memory.

    metrics_test.py OPSERVER_BINARY
"""

import socket
import subprocess
import sys
import unittest
import urllib.request

import testing

testing.prepare()

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import opserver  # noqa: E402

BINARY = None


def scrape(address):
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=30) as r:
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class MetricsTest(unittest.TestCase):

    def test_counters_move_by_exactly_the_work_done(self):
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0",
                            "--max_launch_elements=1024",
                            "--data_port=-1") as server:
            self.assertIsNotNone(server.metrics_address)
            client = opserver.connect(server.address)
            before = scrape(server.metrics_address)
            with client.session("metered") as s:
                g = s.to_device(np.ones(256, np.float32))
                x = s.to_device(np.linspace(-4, 4, 256, dtype=np.float32))
                for _ in range(3):
                    s.threshold_backward(g, x, 0.5)
                gb = s.to_device(torch.ones(8, dtype=torch.bfloat16))
                for _ in range(2):
                    s.hardswish_backward(gb, gb)
                s.synchronize()
                # Over --max_launch_elements: the server refuses the plan
                # (161002) and the synchronize reports it.
                big = s.empty([2048], opserver.DType.FLOAT)
                s.hardswish_backward(big, big, out=big)
                with self.assertRaises(opserver.ResourceExhausted) as e:
                    s.synchronize()
                self.assertEqual(e.exception.aclnn_status, 161002)
                s.upload(g.buffer, np.zeros(256, np.float32))  # 1 KiB
                during = scrape(server.metrics_address)
            after = scrape(server.metrics_address)

        def delta(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        self.assertEqual(delta("opserver_launches_total",
                               op="ThresholdBackward", dtype="FLOAT"), 3)
        self.assertEqual(delta("opserver_launches_total",
                               op="HardswishBackward", dtype="BFLOAT16"), 2)
        self.assertEqual(delta("opserver_launches_total",
                               op="HardswishBackward", dtype="FLOAT"), 0)
        self.assertEqual(delta("opserver_plan_refusals_total",
                               op="HardswishBackward", aclnn_status="161002"),
                         1)
        # The refused plan's error is reported once: by a fence on the
        # channel, or, when the channel had nothing in flight, by the unary
        # SynchronizeStream (Session::Synchronize picks by what is in
        # flight, which depends on how fast the server acknowledged).
        self.assertEqual(
            delta("opserver_pipeline_deferred_errors_total") +
            delta("grpc_server_call_duration_seconds_count",
                  grpc_method="opserver.v1.Runtime/SynchronizeStream",
                  grpc_status="RESOURCE_EXHAUSTED"), 1)
        self.assertEqual(delta("opserver_stream_queue_wait_seconds_count"), 5)
        self.assertEqual(delta("opserver_pipeline_commands_total",
                               command="launch"), 6)
        self.assertEqual(delta("opserver_pipeline_commands_total",
                               command="plan"), 6)
        self.assertGreaterEqual(delta("opserver_pipeline_batches_total"), 1)
        self.assertEqual(delta("grpc_server_call_started_total",
                               grpc_method="opserver.v1.Runtime/CreateSession"),
                         1)
        self.assertEqual(delta("grpc_server_call_duration_seconds_count",
                               grpc_method="opserver.v1.Runtime/CreateSession",
                               grpc_status="OK"), 1)
        self.assertEqual(delta("grpc_server_call_duration_seconds_count",
                               grpc_method="opserver.v1.Runtime/CloseSession",
                               grpc_status="OK"), 1)
        # Every Upload is one transfer over gRPC (the data path is off).
        uploads = delta("grpc_server_call_duration_seconds_count",
                        grpc_method="opserver.v1.Runtime/Upload",
                        grpc_status="OK")
        self.assertEqual(uploads, 4)
        self.assertEqual(delta("opserver_transfers_total", path="grpc"), 4)
        self.assertEqual(delta("opserver_transfer_bytes_total", path="grpc"),
                         1024 + 1024 + 16 + 1024)
        # Scrape-time gauges, with the session open and after it closed.
        self.assertEqual(value(during, "opserver_sessions", device="0",
                               tenant="anonymous"), 1)
        self.assertEqual(value(during, "opserver_buffers", device="0",
                               tenant="anonymous"), 4)
        self.assertGreater(value(during, "opserver_device_memory_used_bytes",
                                 device="0"), 0)
        self.assertGreater(
            value(during, "opserver_device_memory_capacity_bytes", device="0"),
            0)
        self.assertEqual(value(after, "opserver_sessions", device="0",
                               tenant="anonymous"), 0)

    def test_device_gauges_are_per_device(self):
        # Two devices of 32 MiB each; a session on device 1 only.
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0",
                            "--devices=2",
                            "--device_memory_bytes=67108864") as server:
            client = opserver.connect(server.address)
            devices = client.device_info()["devices"]
            self.assertEqual([d.get("index", 0) for d in devices], [0, 1])
            with client.session("on device 1", device=1) as s:
                kept = s.to_device(np.ones(1024, np.float32))
                s.synchronize()
                during = scrape(server.metrics_address)
                del kept
        for device in ("0", "1"):
            self.assertEqual(
                value(during, "opserver_device_memory_capacity_bytes",
                      device=device), 32 << 20)
        self.assertEqual(value(during, "opserver_sessions", device="1",
                               tenant="anonymous"), 1)
        self.assertEqual(value(during, "opserver_sessions", device="0",
                               tenant="anonymous"), 0)
        self.assertEqual(value(during, "opserver_device_memory_used_bytes",
                               device="1"), 4096)
        self.assertEqual(value(during, "opserver_device_memory_used_bytes",
                               device="0"), 0)
        self.assertLessEqual(
            value(during, "opserver_device_memory_free_bytes", device="1"),
            (32 << 20) - 4096)
        self.assertEqual(
            value(during, "opserver_device_memory_free_bytes", device="0"),
            32 << 20)

    def test_data_connections_are_kept_unless_asked_not_to(self):
        # Three uploads and a download of 4 MiB and more go over the data
        # path: on the one connection the client keeps, or on one each.
        data = np.arange((4 << 20) // 4 + 1, dtype=np.float32)
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0") as server:
            for keep, dialed in ((True, 1.0), (False, 4.0)):
                before = scrape(server.metrics_address)
                client = opserver.connect(server.address,
                                          keep_data_connections=keep)
                with client.session("kept") as s:
                    for _ in range(3):
                        t = s.to_device(data)
                    np.testing.assert_array_equal(t.numpy(), data)
                after = scrape(server.metrics_address)
                self.assertEqual(
                    value(after, "opserver_data_port_connections_total") -
                    value(before, "opserver_data_port_connections_total"),
                    dialed, "keep_data_connections=%s" % keep)

    def test_a_made_up_method_is_other(self):
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0") as server:
            # A raw call to a method no service has.
            channel = grpc.insecure_channel(server.address)
            with self.assertRaises(grpc.RpcError):
                channel.unary_unary("/opserver.v1.Runtime/NoSuchMethod")(
                    b"", timeout=10)
            with self.assertRaises(grpc.RpcError):
                channel.unary_unary("/made.up/" + "x" * 100)(b"", timeout=10)
            samples = scrape(server.metrics_address)
            methods = {dict(labels).get("grpc_method")
                       for (name, labels) in samples
                       if name == "grpc_server_call_started_total"}
            self.assertNotIn("opserver.v1.Runtime/NoSuchMethod", methods)
            self.assertFalse(any(m and "made.up" in m for m in methods))

    def test_silent_connections_do_not_block_a_scrape(self):
        # Four connections that send half a request and then nothing, more
        # than civetweb's default two threads. The request time-out is
        # longer than the test, so the scrape succeeds only because a
        # thread is free, while the silent connections still hold theirs.
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0",
                            "--metrics_request_timeout_ms=600000") as server:
            host, port = server.metrics_address.rsplit(":", 1)
            silent = [socket.create_connection((host, int(port)), timeout=60)
                      for _ in range(4)]
            try:
                for s in silent:
                    s.sendall(b"GET /metr")
                samples = scrape(server.metrics_address)
                self.assertIn(
                    ("opserver_device_memory_capacity_bytes",
                     (("device", "0"),)), samples)
                for s in silent:
                    # Still open: nothing to read, and no end of stream.
                    s.setblocking(False)
                    with self.assertRaises(BlockingIOError):
                        s.recv(1, socket.MSG_PEEK)
            finally:
                for s in silent:
                    s.close()

    def test_a_silent_connection_is_closed_after_the_request_timeout(self):
        with testing.Server(BINARY, "--metrics_listen=127.0.0.1:0",
                            "--metrics_request_timeout_ms=100") as server:
            host, port = server.metrics_address.rsplit(":", 1)
            with socket.create_connection((host, int(port)),
                                          timeout=60) as s:
                s.sendall(b"GET /metr")
                # The server ends it (perhaps after an error reply); the
                # generous time-out only bounds a broken server.
                while s.recv(4096):
                    pass
            self.assertIn(("opserver_device_memory_capacity_bytes",
                           (("device", "0"),)),
                          scrape(server.metrics_address))

    def test_non_loopback_needs_allow_insecure(self):
        result = subprocess.run([BINARY, "--listen=127.0.0.1:0",
                                 "--metrics_listen=0.0.0.0:0"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--metrics_listen", result.stderr)
        self.assertIn("--allow_insecure", result.stderr)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
