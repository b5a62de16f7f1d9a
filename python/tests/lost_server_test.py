"""A server killed in the middle of a session: every later call raises a
clear opserver.Error, none hangs (testing.prepare's watchdog fails the test
if one does), and a restarted server is reachable again.

    lost_server_test.py OPSERVER_BINARY
"""

import socket
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
        went_away = "server at %s went away" % server.address
        for call in calls:
            # A lost server, said one way whichever call meets it: the
            # class a retry-on-Unavailable loop retries, not NotFound.
            with self.assertRaises(opserver.Unavailable) as e:
                call()
            self.assertIn(went_away, e.exception.message)
            self.assertNotIn("freed", e.exception.message)
        # Closing a session whose server is gone reports it, once.
        with self.assertRaises(opserver.Unavailable):
            session.close()
        session.close()

    def test_with_block_reports_a_lost_server_once(self):
        server = testing.Server(BINARY)
        self.addCleanup(server.stop)
        client = opserver.connect(server.address)
        with self.assertRaises(opserver.Unavailable) as e:
            with client.session("doomed") as session:
                x = session.to_device(np.float32([1, 2, 3]))
                server.kill()
                x.numpy()
        self.assertIn("server at %s went away" % server.address,
                      e.exception.message)
        # The block's close did not raise a second error over the first.
        self.assertIsNone(e.exception.__context__)

    def test_connecting_to_nothing_raises_unavailable(self):
        # A port nothing listens on: refused at once, said so, however
        # long the time-out.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % sock.getsockname()[1]
        sock.close()
        with self.assertRaises(opserver.Unavailable) as e:
            opserver.connect(address, connect_timeout=600)
        self.assertIn("cannot reach opserver at " + address,
                      e.exception.message)
        self.assertIn("connection refused", e.exception.message)

    def test_a_malformed_address_is_named_before_dialing(self):
        for address, why in (("http://127.0.0.1:50051", "it is a URL"),
                             ("127.0.0.1", "missing ':PORT'"),
                             (":50051", "empty host")):
            with self.assertRaises(opserver.InvalidArgument) as e:
                opserver.connect(address, connect_timeout=600)
            self.assertIn("cannot dial '%s'" % address, e.exception.message)
            self.assertIn(why, e.exception.message)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
