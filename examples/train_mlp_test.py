"""examples/train_mlp.py against a live opserver: 30 steps lower the loss.

    train_mlp_test.py OPSERVER_BINARY
"""

import sys
import unittest

import testing

testing.prepare()

import train_mlp  # noqa: E402

BINARY = None


class TrainMlpTest(unittest.TestCase):

    def test_training_lowers_the_loss(self):
        with testing.Server(BINARY) as server:
            first, last = train_mlp.train(server.address, 30)
        self.assertLess(last, first * 0.5)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
