"""A server killed in the middle of a session: every later call raises a
clear opserver.Error, none hangs (testing.prepare's watchdog fails the test
if one does), and a restarted server is reachable again.

    lost_server_test.py OPSERVER_BINARY
"""

import sys
import unittest

import testing

testing.prepare(timeout_s=240)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import opserver  # noqa: E402
import opserver.torch as ot  # noqa: E402

BINARY = None


class LostServerTest(unittest.TestCase):

    def test_killed_server_raises_and_never_hangs(self):
        server = testing.Server(BINARY)
        self.addCleanup(server.stop)
        client = opserver.connect(server.address, call_timeout=10,
                                  wait_timeout=20)
        session = client.session("doomed")
        x = session.to_device(np.float32([1, 2, 3]))
        y = ot.hardswish(torch.ones(3, requires_grad=True), session=session)
        # Work queued and not yet waited for when the server goes.
        session.hardswish_backward(x, x)
        server.kill()
        calls = [
            lambda: session.synchronize(),
            lambda: x.numpy(),
            lambda: session.malloc(64),
            lambda: session.hardswish_backward(x, x).numpy(),
            lambda: y.sum().backward(),
            lambda: session.to_device(np.float32([1])),
            lambda: client.session("after"),
        ]
        for call in calls:
            with self.assertRaises(opserver.Error) as e:
                call()
            self.assertIn(e.exception.code_name,
                          ("UNAVAILABLE", "CANCELLED", "NOT_FOUND",
                           "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN"),
                          str(e.exception))
            self.assertNotEqual(e.exception.message, "")
        # Closing a session whose server is gone reports it, once.
        with self.assertRaises(opserver.Error):
            session.close()
        session.close()

    def test_connecting_to_nothing_raises_unavailable(self):
        with self.assertRaises(opserver.Unavailable) as e:
            opserver.connect("127.0.0.1:1", connect_timeout=0.5)
        self.assertIn("127.0.0.1:1", e.exception.message)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
