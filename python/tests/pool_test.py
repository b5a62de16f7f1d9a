"""opserver.connect on a pool in etcd (docs/pool.md), against a real etcd
on loopback started by the test and two opservers registered in it: the
ordinals are the C API's (server address, then index), claims give jobs
devices no other job holds, close() frees them, the claim's arguments fall
back to OPSERVER_CLAIM* and every bad value is refused with its range.

    pool_test.py OPSERVER_BINARY
"""

import base64
import json
import os
import sys
import unittest
import urllib.request

import testing

testing.prepare(timeout_s=300)

import numpy as np  # noqa: E402

import opserver  # noqa: E402

BINARY = None
_CLAIM_VARIABLES = ("OPSERVER_CLAIM", "OPSERVER_CLAIM_WAIT_S",
                    "OPSERVER_CLAIM_TTL_S")


class PoolTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        tmp = os.environ.get("TEST_TMPDIR", "/tmp")
        cls.etcd = testing.Etcd(os.path.join(tmp, "etcd"))
        cls.pool = "etcd://%s/ops/pool" % cls.etcd.endpoint
        flags = ("--threads=1", "--register=" + cls.pool,
                 "--register_ttl_s=2")
        # Registered before "listening on": no wait.
        cls.servers = [testing.Server(BINARY, "--devices=2", *flags),
                       testing.Server(BINARY, *flags)]
        # The C API's ordinals: server addresses in key (string) order,
        # then each server's indexes.
        cls.expected = sorted([(cls.servers[0].address, 0),
                               (cls.servers[0].address, 1),
                               (cls.servers[1].address, 0)])

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop()
        cls.etcd.stop()

    def setUp(self):
        for name in _CLAIM_VARIABLES:
            self.assertNotIn(name, os.environ)
        self.addCleanup(self._clear_variables)

    def _clear_variables(self):
        for name in _CLAIM_VARIABLES:
            os.environ.pop(name, None)

    def _held(self, pool):
        return [(d["address"], d["device"]) for d in pool.devices]

    def _etcd(self, method, body):
        """etcd's own JSON gateway (v3), for what the test checks there."""
        request = urllib.request.Request(
            "http://%s/v3/%s" % (self.etcd.endpoint, method),
            data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())

    def _claim_ttls(self):
        """The granted TTL of each claim key's lease, in key order."""
        prefix = b"/ops/pool/claims/"
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        kvs = self._etcd("kv/range", {
            "key": base64.b64encode(prefix).decode(),
            "range_end": base64.b64encode(end).decode()}).get("kvs", [])
        return [int(self._etcd("lease/timetolive",
                               {"ID": kv["lease"]})["grantedTTL"])
                for kv in kvs]

    def test_devices_are_the_c_apis_ordinals(self):
        pool = opserver.connect(self.pool)
        self.assertIsInstance(pool, opserver.Pool)
        self.assertEqual(pool.address, self.pool)
        self.assertEqual(len(pool), 3)
        self.assertEqual(self._held(pool), self.expected)
        for ordinal, device in enumerate(pool.devices):
            self.assertEqual(device["info"]["kind"], "cpu")
            with pool.session("pool", device=ordinal) as s:
                x = s.to_device(np.float32([0.2, 1.2, 2.2, 3.2]))
                g = s.to_device(np.float32([4.5, 4.4, 4.3, 4.2]))
                np.testing.assert_array_equal(
                    s.threshold_backward(g, x, 1.0).numpy(),
                    np.float32([0, 4.4, 4.3, 4.2]))
        with self.assertRaises(opserver.InvalidArgument) as e:
            pool.session(device=3)
        self.assertIn("device 3 does not exist: the 2 servers have 3 devices",
                      e.exception.message)

    def test_claims_never_share_a_device_and_close_frees_them(self):
        first = opserver.connect(self.pool, claim=2)
        second = opserver.connect(self.pool, claim=1)
        self.assertEqual(len(first), 2)
        self.assertEqual(len(second), 1)
        # The first free ones in key order, and never the same device.
        self.assertEqual(self._held(first), self.expected[:2])
        self.assertEqual(self._held(second), self.expected[2:])
        with first.session("claimed", device=1) as s:
            s.malloc(64)
        with self.assertRaises(opserver.ResourceExhausted) as e:
            opserver.connect(self.pool, claim=1)
        self.assertIn(
            "claiming 1 device under etcd prefix /ops/pool/: 3 registered, "
            "0 free (the others are claimed by other jobs or draining); "
            "OPSERVER_CLAIM_WAIT_S=SECONDS waits for them",
            e.exception.message)
        second.close()
        third = opserver.connect(self.pool, claim=1)
        self.assertEqual(self._held(third), self.expected[2:])
        third.close()
        first.close()
        # All three free again.
        with opserver.connect(self.pool, claim=3) as every:
            self.assertEqual(self._held(every), self.expected)

    def test_the_claim_variables_apply_unless_an_argument_is_given(self):
        os.environ["OPSERVER_CLAIM"] = "1"
        os.environ["OPSERVER_CLAIM_TTL_S"] = "5"
        with opserver.connect(self.pool) as claimed:
            self.assertEqual(self._held(claimed), self.expected[:1])
            self.assertEqual(self._claim_ttls(), [5])
            # claim=0 over OPSERVER_CLAIM=1: no claim, every device.
            unclaimed = opserver.connect(self.pool, claim=0)
            self.assertEqual(self._held(unclaimed), self.expected)
        del os.environ["OPSERVER_CLAIM"]
        with opserver.connect(self.pool, claim=2, claim_ttl_s=7) as claimed:
            self.assertEqual(self._claim_ttls(), [7, 7])
        self.assertEqual(self._claim_ttls(), [])

    def test_bad_claim_values_are_refused_with_their_range(self):
        cases = [
            (dict(claim=-1), "claim=-1: not a device count (0 to 4096)"),
            (dict(claim=4097), "claim=4097: not a device count (0 to 4096)"),
            (dict(claim=1, claim_wait_s=-1),
             "claim_wait_s=-1: not seconds (0 to 604800)"),
            (dict(claim=1, claim_ttl_s=0),
             "claim_ttl_s=0: not a lease TTL in seconds (2 to 86400)"),
            (dict(claim=1, claim_ttl_s=-3),
             "claim_ttl_s=-3: not a lease TTL in seconds (2 to 86400)"),
        ]
        for kwargs, message in cases:
            with self.assertRaises(opserver.InvalidArgument) as e:
                opserver.connect(self.pool, **kwargs)
            self.assertEqual(e.exception.message, message)
        for name, value, message in [
                ("OPSERVER_CLAIM", "two",
                 "OPSERVER_CLAIM='two': not a device count (0 to 4096)"),
                ("OPSERVER_CLAIM_WAIT_S", "soon",
                 "OPSERVER_CLAIM_WAIT_S='soon': not seconds (0 to 604800)"),
                ("OPSERVER_CLAIM_TTL_S", "0",
                 "OPSERVER_CLAIM_TTL_S='0': not a lease TTL in seconds "
                 "(2 to 86400)"),
                ("OPSERVER_CLAIM_TTL_S", "ten",
                 "OPSERVER_CLAIM_TTL_S='ten': not a lease TTL in seconds "
                 "(2 to 86400)")]:
            os.environ[name] = value
            with self.assertRaises(opserver.InvalidArgument) as e:
                opserver.connect(self.pool)
            self.assertEqual(e.exception.message, message)
            # An argument given instead: the variable is not read.
            argument = {"OPSERVER_CLAIM": "claim",
                        "OPSERVER_CLAIM_WAIT_S": "claim_wait_s",
                        "OPSERVER_CLAIM_TTL_S": "claim_ttl_s"}[name]
            with opserver.connect(self.pool, **{argument: 2}) as pool:
                self.assertEqual(len(pool), 3 if argument != "claim" else 2)
            del os.environ[name]
        # A claim needs a pool.
        with self.assertRaises(opserver.InvalidArgument) as e:
            opserver.connect(self.servers[1].address, claim=1)
        self.assertEqual(
            e.exception.message,
            "claim= needs an etcd:// address (a pool); %s is one server" %
            self.servers[1].address)
        with self.assertRaises(opserver.InvalidArgument) as e:
            opserver.connect("etcd://%s" % self.etcd.endpoint)
        self.assertIn("no /PREFIX", e.exception.message)

    def test_claim_arguments_of_the_wrong_type_or_size_say_which(self):
        # Too large for C++'s integers: the range message, as for -1 (it
        # was pybind's generic cast error), and a ValueError.
        for kwargs, message in [
                (dict(claim=2 ** 70),
                 "claim=1180591620717411303424: not a device count "
                 "(0 to 4096)"),
                (dict(claim=-2 ** 63 - 1),
                 "claim=-9223372036854775809: not a device count "
                 "(0 to 4096)"),
                (dict(claim=1, claim_ttl_s=2 ** 64),
                 "claim_ttl_s=18446744073709551616: not a lease TTL in "
                 "seconds (2 to 86400)"),
                (dict(claim=1, claim_wait_s=10 ** 30),
                 "claim_wait_s=1000000000000000000000000000000: not "
                 "seconds (0 to 604800)"),
                (dict(claim=1, claim_wait_s=float("nan")),
                 "claim_wait_s=nan: not seconds (0 to 604800)"),
                (dict(claim=1, claim_wait_s=float("inf")),
                 "claim_wait_s=inf: not seconds (0 to 604800)")]:
            with self.assertRaises(ValueError) as e:
                opserver.connect(self.pool, **kwargs)
            self.assertIsInstance(e.exception, opserver.InvalidArgument)
            self.assertEqual(e.exception.message, message)
        # Not a number of the right kind: TypeError naming the argument
        # (a bool is no count: True claimed one device).
        for kwargs, message in [
                (dict(claim=True),
                 "claim must be an int (a device count, 0 to 4096), not "
                 "bool"),
                (dict(claim=2.0),
                 "claim must be an int (a device count, 0 to 4096), not "
                 "float"),
                (dict(claim="2"),
                 "claim must be an int (a device count, 0 to 4096), not "
                 "str"),
                (dict(claim=1, claim_wait_s=False),
                 "claim_wait_s must be a number (seconds, 0 to 604800), "
                 "not bool"),
                (dict(claim=1, claim_wait_s="5"),
                 "claim_wait_s must be a number (seconds, 0 to 604800), "
                 "not str"),
                (dict(claim=1, claim_ttl_s=True),
                 "claim_ttl_s must be an int (a lease TTL in seconds, 2 to "
                 "86400), not bool"),
                (dict(claim=1, claim_ttl_s=7.5),
                 "claim_ttl_s must be an int (a lease TTL in seconds, 2 to "
                 "86400), not float")]:
            with self.assertRaises(TypeError) as e:
                opserver.connect(self.pool, **kwargs)
            self.assertEqual(str(e.exception), message)
        # What Python takes as an int or a number still works: a float
        # wait, and an int-like object (operator.index) as a count.
        class Two:
            def __index__(self):
                return 2
        with opserver.connect(self.pool, claim=Two(), claim_wait_s=0.5,
                              claim_ttl_s=Two()) as claimed:
            self.assertEqual(self._held(claimed), self.expected[:2])
            self.assertEqual(self._claim_ttls(), [2, 2])


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
