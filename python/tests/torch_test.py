"""opserver.torch against a live opserver: gradients equal torch's own
modules bit for bit, gradcheck, a small MLP trained with remote backward
passes ending with exactly the parameters of the same run done locally,
and the session's resolution.

    torch_test.py OPSERVER_BINARY
"""

import threading

import testing

testing.prepare()

import torch  # noqa: E402

import opserver  # noqa: E402
import opserver.torch as ot  # noqa: E402



def pairs():
    """(ours, torch's) for every module, with non-default arguments."""
    return [
        (ot.nn.Threshold(0.1, 20.0), torch.nn.Threshold(0.1, 20.0)),
        (ot.nn.Softshrink(0.75), torch.nn.Softshrink(0.75)),
        (ot.nn.Hardswish(), torch.nn.Hardswish()),
        (ot.nn.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
        (ot.nn.Dropout(0.3), torch.nn.Dropout(0.3)),
    ]


class TorchTest(testing.ServerTestCase):

    def setUp(self):
        super().setUp()
        remote = ot.remote(self.session)
        remote.__enter__()
        self.addCleanup(remote.__exit__, None, None, None)

    def test_modules_match_torch_bit_for_bit(self):
        # Values away from the documented differences (hardswish at exactly
        # 3, NaN inputs): random fp32 in [-5, 5], plus the boundaries.
        g = torch.Generator().manual_seed(3)
        x0 = torch.rand(4, 33, generator=g) * 10 - 5
        x0[0, :6] = torch.tensor([-3.0, 0.0, 0.1, 0.75, -0.75, 2.9])
        grad = torch.randn(4, 33, generator=g)
        for ours, theirs in pairs():
            with self.subTest(module=type(ours).__name__):
                x1 = x0.clone().requires_grad_()
                x2 = x0.clone().requires_grad_()
                torch.manual_seed(7)
                y1 = ours(x1)
                torch.manual_seed(7)
                y2 = theirs(x2)
                self.assertTrue(torch.equal(y1, y2))
                y1.backward(grad)
                y2.backward(grad)
                self.assertTrue(torch.equal(x1.grad, x2.grad),
                                "%s\n%s" % (x1.grad, x2.grad))

    def test_in_place_forms(self):
        x0 = torch.randn(64, generator=torch.Generator().manual_seed(5))
        cases = [
            (lambda t: ot.leaky_relu(t, 0.1, inplace=True),
             lambda t: torch.nn.functional.leaky_relu(t, 0.1, inplace=True)),
            (lambda t: ot.hardswish(t, inplace=True),
             lambda t: torch.nn.functional.hardswish(t, inplace=True)),
            (lambda t: ot.threshold(t, 0.2, -1.0, inplace=True),
             lambda t: torch.nn.functional.threshold(t, 0.2, -1.0, inplace=True)),
            (lambda t: ot.dropout(t, 0.5, inplace=True),
             lambda t: torch.nn.functional.dropout(t, 0.5, inplace=True)),
        ]
        for ours, theirs in cases:
            a = x0.clone().requires_grad_()
            b = x0.clone().requires_grad_()
            torch.manual_seed(1)
            y1 = ours(a * 1)
            torch.manual_seed(1)
            y2 = theirs(b * 1)
            self.assertTrue(torch.equal(y1, y2))
            y1.sum().backward()
            y2.sum().backward()
            self.assertTrue(torch.equal(a.grad, b.grad))

    def test_a_chain_of_remote_operators_waits_once(self):
        """40 remote activations in a row: every gradient but the last stays
        on the device, so the backward waits once, and the result is
        torch's."""
        x0 = torch.randn(3, 50, generator=torch.Generator().manual_seed(9))
        ours = [ot.nn.LeakyReLU(0.5), ot.nn.Hardswish(), ot.nn.Softshrink(0.01),
                ot.nn.Threshold(-2.0, 0.0)] * 10
        theirs = [torch.nn.LeakyReLU(0.5), torch.nn.Hardswish(),
                  torch.nn.Softshrink(0.01), torch.nn.Threshold(-2.0, 0.0)] * 10
        grads = []
        for chain in (ours, theirs):
            x = (x0 * 1).requires_grad_()
            y = x * 2  # Not a leaf, and not ours: its gradient is torch's.
            for module in chain:
                y = module(y)
            before = ot.stats()["waits"]
            y.backward(torch.ones_like(y))
            grads.append((x.grad, ot.stats()["waits"] - before))
        (ours_grad, waits), (torch_grad, _) = grads
        self.assertEqual(waits, 1)
        self.assertTrue(torch.equal(ours_grad, torch_grad))

    def test_pending_gradients_that_torch_touches_are_read(self):
        # y feeds a remote activation and a local one: the two gradients
        # are summed by torch, which reads the pending one first.
        x0 = torch.randn(64, generator=torch.Generator().manual_seed(6))
        results = []
        for nn in (ot.nn, torch.nn):
            x = x0.clone().requires_grad_()
            y = nn.Hardswish()(x * 3)
            z = nn.LeakyReLU(0.2)(y) + y.sin()
            z.sum().backward()
            results.append(x.grad)
        self.assertTrue(torch.equal(*results))

    def test_a_training_step_waits_once_per_remote_gradient_torch_needs(self):
        # Linear -> Hardswish -> Dropout -> Linear -> LeakyReLU -> Linear:
        # Dropout's gradient goes straight into Hardswish's backward, so
        # only Hardswish's and LeakyReLU's reach torch: two waits a step,
        # and the first step's buffers are reused by the next ones.
        model = testing.mlp(True)
        x, label = torch.randn(8, 784), torch.randint(0, 10, (8,))
        waits = []
        for _ in range(3):
            before = ot.stats()["waits"]
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), label).backward()
            waits.append(ot.stats()["waits"] - before)
        self.assertEqual(waits, [2, 2, 2])
        buffers = self.session.stats()
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), label).backward()
        self.assertEqual(self.session.stats()["buffers"], buffers["buffers"])

    def test_gradcheck(self):
        x = torch.randn(32, dtype=torch.double, requires_grad=True,
                        generator=torch.Generator().manual_seed(2))
        self.assertTrue(torch.autograd.gradcheck(
            lambda t: ot.leaky_relu(t, 0.2), (x,)))

    def test_half_dtypes(self):
        # The gradient has the input's dtype, computed in fp32 and rounded
        # once, as the spec says. (torch 1.13 computes none of the five
        # forwards in fp16 on the CPU; client_test covers fp16 backwards.)
        x = (torch.arange(-20, 20) / 4).to(torch.bfloat16).requires_grad_()
        ot.hardswish(x).backward(torch.full((40,), 3.0, dtype=torch.bfloat16))
        xf = x.detach().float()
        want = (3.0 * torch.where(xf < -3, 0.0, torch.where(
            xf <= 3, xf / 3 + 0.5, 1.0))).to(torch.bfloat16)
        self.assertEqual(x.grad.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(x.grad, want))

    def test_dropout_differs_from_torch_only_where_documented(self):
        # A dropped element's gradient is exactly 0 in aclnn; torch's
        # grad * 0 is NaN for an infinite gradient and -0.0 for a negative.
        x = torch.ones(256, requires_grad=True)
        torch.manual_seed(4)
        y = ot.dropout(x, 0.5)
        grad = torch.full((256,), -float("inf"))
        y.backward(grad)
        dropped = y == 0
        self.assertTrue(dropped.any())
        self.assertTrue(torch.equal(x.grad[dropped],
                                    torch.zeros(int(dropped.sum()))))
        self.assertFalse(torch.signbit(x.grad[dropped]).any())
        self.assertTrue(torch.isinf(x.grad[~dropped]).all())

    def test_training_matches_local_training(self):
        """50 steps of SGD with remote backward passes end with exactly the
        parameters of the same run with torch's modules."""
        data = torch.Generator().manual_seed(11)
        batches = [(torch.randn(32, 784, generator=data),
                    torch.randint(0, 10, (32,), generator=data))
                   for _ in range(50)]
        results = []
        for remote in (True, False):
            model = testing.mlp(remote)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05,
                                        momentum=0.9)
            torch.manual_seed(123)
            for x, label in batches:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), label)
                loss.backward()
                optimizer.step()
            results.append([p.detach().clone() for p in model.parameters()])
        for ours, theirs in zip(*results):
            self.assertTrue(torch.equal(ours, theirs))
        # And training moved them: the comparison is not of two initial
        # states.
        self.assertFalse(torch.equal(results[0][0], testing.mlp(False)[0].weight))

    def test_dropout_outside_training_is_the_identity(self):
        x = torch.randn(8, requires_grad=True)
        self.assertIs(ot.dropout(x, 0.5, training=False), x)
        self.assertIs(ot.dropout(x, 0.0), x)
        model = ot.nn.Dropout(0.5).eval()
        self.assertIs(model(x), x)

    def test_session_resolution(self):
        x = torch.ones(3, requires_grad=True)
        other = self.client.session("explicit")
        self.addCleanup(other.close)
        y = ot.hardswish(x, session=other)
        y.sum().backward()
        self.assertTrue(torch.equal(x.grad, torch.ones(3) / 3 + 0.5))
        errors = []

        def no_session():
            try:
                ot.hardswish(torch.ones(1, requires_grad=True))
            except RuntimeError as e:
                errors.append(str(e))

        # The remote() block belongs to this thread only.
        thread = threading.Thread(target=no_session)
        thread.start()
        thread.join()
        self.assertEqual(len(errors), 1)
        self.assertIn("no opserver session", errors[0])

    def test_bad_arguments_raise(self):
        # In place, the result stays resident (selfIsResult), which a
        # negative slope cannot be differentiated from: aclnn's 161002.
        x = torch.ones(2, requires_grad=True)
        y = ot.leaky_relu(x * 1, -0.5, inplace=True)
        with self.assertRaises(opserver.InvalidArgument) as e:
            y.sum().backward()
        self.assertEqual(e.exception.aclnn_status, 161002)
        self.assertIn("negativeSlope", e.exception.message)
        with self.assertRaises(ValueError):
            ot.nn.Dropout(1.5)


if __name__ == "__main__":
    testing.main()
