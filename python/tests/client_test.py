"""The Python client against a live opserver: every operator and dtype
against the spec's worked examples and references computed by torch,
views, the two phases, streams, errors with their exact aclnn statuses, and
two threads that must not wait for each other.

    client_test.py OPSERVER_BINARY
"""

import threading
import unittest

import testing

testing.prepare()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import opserver  # noqa: E402
from opserver import DType  # noqa: E402

D = torch.float32
# The spec's dtypes per operator (gradOutput, self and out the same here;
# promotion is tested on its own below).
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def reference(fn, grad, x, dtype):
    """`fn` computed in fp32 (double for double) and rounded on store, as
    the spec says fp16 and bf16 are."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return fn(grad.to(wide), x.to(wide)).to(dtype)


def special_values(dtype, n=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g) * 10 - 5).to(dtype)
    specials = torch.tensor([-3, 3, -2.5, 0.5, 0, -0.0, float("nan"),
                             float("inf"), -float("inf"), 1, -1, 0.25])
    x[:specials.numel()] = specials.to(dtype)
    grad = (torch.rand(n, generator=g) * 4 - 2).to(dtype)
    grad[20] = float("nan")
    grad[21] = float("inf")
    return grad, x


def bits_equal(a, b):
    """Bitwise equality (so -0.0 differs from 0.0), any NaN equal to any
    NaN (their payloads are not specified)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    a, b = a.contiguous().view(view), b.contiguous().view(view)
    return bool(((a == b) | both_nan).all())


class DTypeNamesTest(unittest.TestCase):
    """Both names of aclDataType 27, one printed (docs/api.md's table)."""

    def test_bf16_is_bfloat16(self):
        self.assertIs(DType.BF16, DType.BFLOAT16)
        self.assertIs(DType["BF16"], DType.BFLOAT16)
        self.assertEqual(DType.BF16.name, "BFLOAT16")
        self.assertEqual(int(DType.BF16), 27)


class ClientTest(testing.ServerTestCase):

    server_flags = ("--device_memory_bytes=268435456",)

    def assertBits(self, got, want):
        self.assertTrue(bits_equal(got, want), "got %s\nwant %s" % (got, want))

    # The spec's worked examples, as the samples compute them.
    def test_worked_examples(self):
        s = self.session
        out = s.threshold_backward(
            np.float32([4.5, 4.4, 4.3, 4.2]), np.float32([0.2, 1.2, 2.2, 3.2]),
            1.0)
        np.testing.assert_array_equal(out, np.float32([0, 4.4, 4.3, 4.2]))
        mask = np.zeros(16, np.uint8)
        mask[0] = 42
        out = s.dropout_backward(np.arange(8, dtype=np.float32).reshape(4, 2),
                                 mask, 2.0)
        np.testing.assert_array_equal(
            out, np.float32([0, 2, 0, 6, 0, 10, 0, 0]).reshape(4, 2))

    # Hand-computed: each operator's branches and boundaries.
    def test_hand_computed(self):
        s = self.session
        x = np.float32([-4, -3, 0, 3, 4, np.nan])
        g = np.float32([1, 2, 3, 4, 5, 6])
        np.testing.assert_array_equal(s.hardswish_backward(g, x),
                                      np.float32([0, -1, 1.5, 6, 5, 6]))
        np.testing.assert_array_equal(
            s.softshrink_backward(g, np.float32([-1, -0.5, 0, 0.5, 0.6, np.nan]),
                                  0.5),
            np.float32([1, 0, 0, 0, 5, 6]))
        np.testing.assert_array_equal(
            s.leaky_relu_backward(g, x, 0.5), np.float32([0.5, 1, 1.5, 4, 5, 3]))
        np.testing.assert_array_equal(
            s.threshold_backward(np.int8([1, 2, 3]), np.int8([0, 1, 2]), 0.5),
            np.int8([0, 2, 3]))

    def test_every_float_dtype_against_the_spec_and_torch(self):
        """Each result against the spec's formula on every element, and
        against torch's own backward wherever the spec and torch agree.
        They differ (aclnn's reading is the spec's) at: a NaN `self` in
        softshrink (aclnn passes the gradient, torch gives 0) and hardswish
        (aclnn passes the gradient, torch gives NaN); hardswish at exactly
        3 (aclnn: x 1.5; torch 1.13's vectorized loop: x 1, its scalar
        tail: x 1.5); and hardswish below -3, where aclnn multiplies by 0
        (-0.0 for a negative gradient, NaN for an infinite one) and torch
        selects +0.0."""
        s = self.session
        nan = lambda x: torch.isnan(x)
        ops = [
            ("threshold_backward", (0.75,),
             lambda g, x: torch.where(x <= 0.75, torch.zeros_like(g), g),
             lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.75),
             lambda g, x: torch.zeros_like(x, dtype=torch.bool)),
            ("softshrink_backward", (0.5,),
             lambda g, x: torch.where(x.abs() <= 0.5, torch.zeros_like(g), g),
             lambda g, x: torch.ops.aten.softshrink_backward(g, x, 0.5),
             lambda g, x: nan(x)),
            ("hardswish_backward", (),
             lambda g, x: g * torch.where(
                 x < -3, torch.zeros_like(x),
                 torch.where(x <= 3, x / 3 + 0.5, torch.ones_like(x))),
             lambda g, x: torch.ops.aten.hardswish_backward(g, x),
             lambda g, x: nan(x) | (x == 3) | (x < -3)),
            ("leaky_relu_backward", (0.25, False),
             lambda g, x: torch.where(x > 0, g, g * 0.25),
             lambda g, x: torch.ops.aten.leaky_relu_backward(g, x, 0.25, False),
             lambda g, x: torch.zeros_like(x, dtype=torch.bool)),
        ]
        for name, params, spec, torch_op, differs in ops:
            for dtype in FLOATS:
                with self.subTest(op=name, dtype=dtype):
                    grad, x = special_values(dtype)
                    got = getattr(s, name)(grad, x, *params)
                    self.assertBits(got, reference(spec, grad, x, dtype))
                    same = ~differs(grad.float(), x.float())
                    self.assertBits(got[same],
                                    reference(torch_op, grad, x, dtype)[same])
        grad, x = special_values(torch.float64)
        self.assertBits(
            s.leaky_relu_backward(grad, x, opserver.Scalar(0.25, DType.DOUBLE)),
            torch.ops.aten.leaky_relu_backward(grad, x, 0.25, False))

    def test_integer_threshold(self):
        s = self.session
        for dtype in [torch.int8, torch.uint8, torch.int32]:
            with self.subTest(dtype=dtype):
                x = torch.arange(0, 100).to(dtype)
                g = torch.arange(100, 200).to(dtype) if dtype != torch.int8 \
                    else torch.arange(-50, 50).to(dtype)
                self.assertBits(s.threshold_backward(g, x, 49.5),
                                torch.ops.aten.threshold_backward(g, x, 49.5))

    def test_dropout_every_dtype(self):
        s = self.session
        for dtype in FLOATS:
            with self.subTest(dtype=dtype):
                grad, _ = special_values(dtype, n=1111)
                keep = torch.rand(1111, generator=torch.Generator().manual_seed(1)) < 0.6
                mask = np.zeros(144, np.uint8)  # align(1111, 128) / 8
                mask[:139] = np.packbits(keep.numpy(), bitorder="little")
                got = s.dropout_backward(grad, mask, 1.25)
                want = torch.where(keep, (grad.float() * 1.25).to(dtype),
                                   torch.zeros((), dtype=dtype))
                self.assertBits(got, want)

    def test_promotion_and_out_dtype(self):
        s = self.session
        g = torch.tensor([1.5, -2.0, 3.0], dtype=torch.float16)
        x = torch.tensor([0.1, -0.7, 2.0], dtype=torch.bfloat16)
        got = s.softshrink_backward(g, x, 0.5)
        self.assertEqual(got.dtype, torch.float32)
        self.assertBits(got, torch.tensor([0.0, -2.0, 3.0]))
        # The spec's example: rounded to FLOAT16 first, then cast.
        out = s.empty([2], DType.FLOAT)
        s.leaky_relu_backward(np.float16([65504, 0.1]), np.float16([-1, -1]),
                              2.5, out=out)
        np.testing.assert_array_equal(out.numpy(),
                                      np.float32([np.inf, np.float16(0.25)]))

    def test_broadcast_views_and_empty(self):
        s = self.session
        g = s.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
        x = s.to_device(np.float32([0, 2, 5]))
        np.testing.assert_array_equal(
            s.threshold_backward(g, x, 1.0).numpy(),
            np.float32([[0, 1, 2], [0, 4, 5]]))
        # A transposed view of a 3x2 storage, and a strided output view.
        storage = s.to_device(np.float32([[1, 2], [3, 4], [5, 6]]))
        xt = storage.view([2, 3], strides=[1, 2])
        # Zeros written, not assumed: memory this session freed a moment
        # ago (the first result above, once the server's download slices
        # let go of it) may come back unzeroed, as the server clears only
        # memory another owner held.
        big = s.to_device(np.zeros((2, 6), np.float32))
        out = big.view([2, 3], strides=[6, 2], offset=1)
        s.threshold_backward(s.to_device(np.ones((2, 3), np.float32)), xt, 2.5,
                             out=out)
        np.testing.assert_array_equal(
            big.numpy(), np.float32([[0, 0, 0, 1, 0, 1], [0, 0, 0, 1, 0, 1]]))
        np.testing.assert_array_equal(out.numpy(),
                                      np.float32([[0, 1, 1], [0, 1, 1]]))
        empty = s.hardswish_backward(np.zeros((0, 3), np.float32),
                                     np.zeros((0, 3), np.float32))
        self.assertEqual(empty.shape, (0, 3))

    def test_two_phases_repeatable_and_workspace(self):
        s = self.session
        g = s.to_device(np.float32([1, 2, 3, 4]))
        x = s.to_device(np.float32([-1, 0.5, 0.7, 2]))
        out = s.empty([4], DType.FLOAT)
        plan = s.softshrink_backward(g, x, 0.6, out=out, launch=False)
        self.assertIsInstance(plan, opserver.Executor)
        self.assertEqual(plan.workspace_size, 0)
        plan.set_repeatable()
        stream = s.create_stream()
        plan.execute(stream)
        plan.execute(stream)
        s.synchronize(stream)
        np.testing.assert_array_equal(out.numpy(), np.float32([1, 0, 3, 4]))
        plan.destroy()
        # A strided mask is gathered into a workspace (the spec's rule).
        mask = s.to_device(np.repeat(np.uint8([255, 0]), 16))
        every_other = mask.view([16], strides=[2])
        plan = s.dropout_backward(s.to_device(np.ones(8, np.float32)),
                                  every_other, 2.0, launch=False)
        self.assertGreater(plan.workspace_size, 0)
        with self.assertRaises(opserver.Error) as e:
            plan.execute()  # no workspace
        self.assertEqual(e.exception.aclnn_status, 161002)
        plan = s.dropout_backward(s.to_device(np.ones(8, np.float32)),
                                  every_other, 2.0, launch=False)
        plan.execute(workspace=s.malloc(plan.workspace_size))
        np.testing.assert_array_equal(plan.out.numpy(), np.full(8, 2, np.float32))

    def test_queued_writes_and_reads(self):
        s = self.session
        g = s.empty([4], DType.FLOAT)
        x = s.empty([4], DType.FLOAT)
        s.write(g.buffer, np.float32([4.5, 4.4, 4.3, 4.2]))
        s.write(x.buffer, torch.tensor([0.2, 1.2, 2.2, 3.2]))
        out = s.threshold_backward(g, x, 1.0)
        host = np.full(4, -1, np.float32)
        pending = s.read_async(out.buffer, host)
        # Queued after the read: it must not change what the read sees.
        s.write(out.buffer, np.zeros(4, np.float32))
        self.assertIs(pending.wait(), host)
        np.testing.assert_array_equal(host, np.float32([0, 4.4, 4.3, 4.2]))
        np.testing.assert_array_equal(out.numpy(), np.zeros(4, np.float32))
        t = torch.empty(2, dtype=torch.bfloat16)
        s.write(g.buffer, torch.tensor([1.5, -2], dtype=torch.bfloat16))
        s.read_async(g.buffer, t).wait()
        self.assertTrue(torch.equal(t, torch.tensor([1.5, -2],
                                                    dtype=torch.bfloat16)))
        # Bigger than one command (1 MiB): an upload and a download.
        big = np.arange(1 << 19, dtype=np.float32)
        d = s.empty([1 << 19], DType.FLOAT)
        s.write(d.buffer, big)
        back = np.empty_like(big)
        s.read_async(d.buffer, back).wait()
        np.testing.assert_array_equal(back, big)
        # Errors: out of range at once; a failed launch at wait().
        with self.assertRaises(opserver.OutOfRange):
            s.write(g.buffer, np.zeros(8, np.float32))
        with self.assertRaises(opserver.OutOfRange):
            s.read_async(g.buffer, np.zeros(8, np.float32))
        with self.assertRaises(opserver.InvalidArgument):
            s.read_async(g.buffer, np.zeros((2, 2), np.float32).T)

    def test_torch_transfers_without_numpy_types(self):
        s = self.session
        for dtype in FLOATS + [torch.float64, torch.int32, torch.uint8]:
            with self.subTest(dtype=dtype):
                t = (torch.arange(12) - 3).to(dtype).reshape(3, 4)
                d = s.to_device(t)
                self.assertBits(d.torch(), t)
                back = torch.empty_like(t)
                s.download(d.buffer, back)
                self.assertBits(back, t)
                self.assertBits(d.view([4, 3], strides=[1, 4]).torch(), t.t())

    def test_bad_arguments_raise_the_exact_status(self):
        s = self.session
        cases = [
            (lambda: s.threshold_backward(np.float32([1]), np.int8([1]), 0.5),
             opserver.InvalidArgument, 161002,
             "self has dtype INT8 but gradOutput has FLOAT; they must match"),
            (lambda: s.softshrink_backward(np.float32([1]), np.float32([1]), -1.0),
             opserver.InvalidArgument, 161002, "lambd"),
            (lambda: s.hardswish_backward(np.float32([1, 2]), np.float32([1])),
             opserver.InvalidArgument, 161002, "shape"),
            (lambda: s.dropout_backward(np.float32([1]), np.zeros(3, np.uint8), 2.0),
             opserver.InvalidArgument, 161002, "mask"),
            (lambda: s.dropout_backward(np.float32([1]), np.zeros(16, np.uint8), 0.5),
             opserver.InvalidArgument, 161002, "scale"),
            (lambda: s.leaky_relu_backward(np.float32([1]), np.float32([1]), -0.5, True),
             opserver.InvalidArgument, 161002, "negativeSlope"),
            (lambda: s.leaky_relu_backward(np.float32([1]), np.float32([1]), 0.5,
                                           out=np.int32([0])),
             opserver.InvalidArgument, 161002, "out"),
        ]
        for call, kind, status, text in cases:
            with self.subTest(text=text):
                with self.assertRaises(kind) as e:
                    call()
                self.assertEqual(e.exception.aclnn_status, status)
                self.assertEqual(e.exception.code_name, "INVALID_ARGUMENT")
                self.assertIn(text, e.exception.message)
        with self.assertRaises(opserver.InvalidArgument) as e:
            s.threshold_backward(None, np.float32([1]), 0.5)
        self.assertEqual(e.exception.aclnn_status, 161001)
        with self.assertRaises(TypeError):
            s.hardswish_backward(np.float32([1]), np.float32([1]), 0.5)
        with self.assertRaises(TypeError):
            s.threshold_backward(np.float32([1]), np.float32([1]), lambd=0.5)
        with self.assertRaises(opserver.InvalidArgument):  # not contiguous
            s.download(s.malloc(16), np.zeros((2, 2), np.float32).T)
        with self.assertRaises(opserver.InvalidArgument):
            opserver.dtype_of(np.complex64([1]))

    def test_server_errors(self):
        s = self.session
        with self.assertRaises(opserver.ResourceExhausted) as e:
            s.malloc(1 << 40)
        self.assertNotEqual(e.exception.message, "")
        buf = s.malloc(16)
        with self.assertRaises(opserver.Error) as e:
            s.download(buf, np.zeros(8, np.float32))  # 32 bytes from 16
        self.assertIn(e.exception.code_name, ("OUT_OF_RANGE", "INVALID_ARGUMENT"))
        buf.free()
        with self.assertRaises(opserver.NotFound):
            s.upload(buf, np.zeros(2, np.float32))
        with self.assertRaises(opserver.Unavailable):
            opserver.connect("127.0.0.1:1", connect_timeout=0.5)

    def test_closed_session_and_context_manager(self):
        with self.client.session("scoped") as s:
            t = s.to_device(np.float32([1, 2]))
        self.assertTrue(s.closed)
        with self.assertRaises(opserver.NotFound):
            s.malloc(16)
        del t  # Its buffer went with the session: freeing it is a no-op.

    def test_two_sessions_on_two_threads_do_not_wait_for_each_other(self):
        """One thread waits on a held stream while the other makes round
        trips: the blocking call must release the GIL (if it did not, the
        round trips could never run and the test would hang). The waiter's
        stream is held by a gate the test releases only after the other
        thread's 20 calls, so the order is certain, not a race."""
        slow = self.client.session("slow")
        self.addCleanup(slow.close)
        nbytes = 64 << 20  # 16 chunks of the default 4 MiB.
        gate_buffer = slow.malloc(nbytes)
        events = []
        waiting = threading.Event()

        def waiter():
            waiting.set()
            slow.synchronize()
            events.append("waiter done")

        with testing.HeldStream(self.server.address, slow, gate_buffer,
                                nbytes) as gate:
            thread = threading.Thread(target=waiter)
            thread.start()
            waiting.wait()
            fast = self.session
            for _ in range(20):
                np.testing.assert_array_equal(
                    fast.threshold_backward(np.float32([1]), np.float32([2]),
                                            1.0),
                    np.float32([1]))
            events.append("fast done")
            # The waiter cannot be done: its stream is still held.
            self.assertTrue(thread.is_alive())
            self.assertEqual(gate.release(), nbytes)
        thread.join()
        self.assertEqual(events, ["fast done", "waiter done"])

if __name__ == "__main__":
    testing.main()
