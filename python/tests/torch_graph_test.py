"""opserver.torch.Graph against a live opserver: a training loop whose
remote backward is captured once and replayed ends with exactly the
parameters of the eager loop and of torch.nn's; a replayed step sends no
operator and waits once per remote gradient torch needs (once for a model
whose remote modules sit in one run), counted by the client and by the
server's /metrics; and every misuse raises GraphError with its message.

    torch_graph_test.py OPSERVER_BINARY
"""

import contextlib
import threading
import urllib.request

import testing

testing.prepare()

import torch  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import opserver  # noqa: E402
import opserver.torch as ot  # noqa: E402

MISMATCH = ("; a replay makes the remote calls of its capture, with their "
            "shapes, dtypes and parameters (capture another Graph for this "
            "step)")


def one_run_mlp(remote):
    """784-256-10 whose remote modules follow each other: their gradients
    stay on the device, and torch needs one back per step."""
    nn = ot.nn if remote else torch.nn
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), nn.Hardswish(), nn.Dropout(0.2),
        nn.LeakyReLU(0.05), torch.nn.Linear(256, 10))


def batches(count, batch=32):
    data = torch.Generator().manual_seed(11)
    return [(torch.randn(batch, 784, generator=data),
             torch.randint(0, 10, (batch,), generator=data))
            for _ in range(count)]


def step(model, x, label):
    torch.nn.functional.cross_entropy(model(x), label).backward()


def scrape(address):
    """{(sample name, sorted labels): value} of one /metrics scrape."""
    with urllib.request.urlopen("http://%s/metrics" % address, timeout=30) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples}


def command(samples, kind):
    return samples.get(("opserver_pipeline_commands_total",
                        (("command", kind),)), 0.0)


class GraphTest(testing.ServerTestCase):

    server_flags = ("--metrics_listen=127.0.0.1:0",)

    def setUp(self):
        super().setUp()
        remote = ot.remote(self.session)
        remote.__enter__()
        self.addCleanup(remote.__exit__, None, None, None)

    def train(self, make_model, mode, data, graph=None):
        """SGD with momentum over `data`: "graph" (graph.step() around each
        step), "eager" or "local" (torch.nn's modules). Returns the
        parameters and, per step, (waits, replays) of ot.stats()."""
        model = make_model(mode != "local")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05,
                                    momentum=0.9)
        torch.manual_seed(123)  # Dropout's masks.
        counts = []
        for x, label in data:
            optimizer.zero_grad()
            before = ot.stats()
            with graph.step() if mode == "graph" else contextlib.nullcontext():
                step(model, x, label)
            after = ot.stats()
            counts.append((after["waits"] - before["waits"],
                           after["replays"] - before["replays"]))
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()], counts

    def assertSameParameters(self, ours, theirs):
        self.assertEqual(len(ours), len(theirs))
        for a, b in zip(ours, theirs):
            self.assertTrue(torch.equal(a, b))

    def test_replayed_training_matches_eager_and_torch(self):
        """testing.mlp has two remote runs (Hardswish+Dropout, LeakyReLU)
        with local Linears between: two segments, so a replayed step waits
        twice, as the eager one does, and replays two graphs."""
        data = batches(30)
        graph = ot.Graph()
        replayed, counts = self.train(testing.mlp, "graph", data, graph)
        eager, eager_counts = self.train(testing.mlp, "eager", data)
        local, _ = self.train(testing.mlp, "local", data)
        self.assertSameParameters(replayed, eager)
        self.assertSameParameters(replayed, local)
        self.assertFalse(torch.equal(local[0], testing.mlp(False)[0].weight))
        self.assertEqual(counts, [(2, 2)] * 30)
        self.assertEqual(eager_counts, [(2, 0)] * 30)
        # LeakyReLU's backward alone, then Dropout's and Hardswish's.
        self.assertEqual(graph.segments, [1, 2])
        self.assertEqual(self.session.stats()["graphs"], "2")
        graph.destroy()
        self.assertEqual(self.session.stats()["graphs"], "0")

    def test_a_replayed_step_waits_once_and_sends_no_operator(self):
        data = batches(12)
        graph = ot.Graph()
        model = one_run_mlp(True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(123)
        counts = []
        for i, (x, label) in enumerate(data):
            if i == 1:  # After the capture.
                before = scrape(self.server.metrics_address)
                buffers = self.session.stats()["buffers"]
            optimizer.zero_grad()
            waits, replays = ot.stats()["waits"], ot.stats()["replays"]
            with graph.step():
                step(model, x, label)
            counts.append((ot.stats()["waits"] - waits,
                           ot.stats()["replays"] - replays))
            optimizer.step()
        after = scrape(self.server.metrics_address)
        self.assertEqual(counts, [(1, 1)] * 12)
        self.assertEqual(graph.segments, [3])
        # The server's view of the 11 replayed steps: per step one replay
        # of 3 tasks and one fence (the read of Hardswish's gradient); no
        # plan, no launch, no allocation.
        delta = lambda f: f(after) - f(before)
        self.assertEqual(delta(lambda s: command(s, "replay_graph")), 11)
        self.assertEqual(delta(lambda s: command(s, "fence")), 11)
        self.assertEqual(delta(lambda s: command(s, "launch")), 0)
        self.assertEqual(delta(lambda s: command(s, "plan")), 0)
        self.assertEqual(delta(lambda s: s[("opserver_graph_replays_total",
                                            ())]), 11)
        self.assertEqual(delta(lambda s: s[(
            "opserver_graph_replayed_tasks_total", ())]), 33)
        self.assertEqual(self.session.stats()["buffers"], buffers)
        # And the replayed training is the eager one and torch.nn's.
        replayed = [p.detach().clone() for p in model.parameters()]
        for remote in (True, False):
            model = one_run_mlp(remote)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            torch.manual_seed(123)
            for x, label in data:
                optimizer.zero_grad()
                step(model, x, label)
                optimizer.step()
            self.assertSameParameters(
                replayed, [p.detach() for p in model.parameters()])

    def test_a_pending_gradient_torch_touches_runs_its_segment(self):
        # y feeds a remote activation and a local one: torch sums the two
        # gradients, reading the pending one, which replays its segment.
        inputs = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
        graph = ot.Graph()

        def grad(nn, x0, block=contextlib.nullcontext):
            x = x0.clone().requires_grad_()
            with block():
                y = nn.Hardswish()(x * 3)
                z = nn.LeakyReLU(0.2)(y) + y.sin()
                z.sum().backward()
            return x.grad

        self.assertTrue(torch.equal(grad(ot.nn, inputs[0], graph.capture),
                                    grad(torch.nn, inputs[0])))
        self.assertTrue(torch.equal(grad(ot.nn, inputs[1], graph.replay),
                                    grad(torch.nn, inputs[1])))
        self.assertEqual(graph.segments, [1, 1])

    def capture(self, graph, model, x, label):
        with graph.capture():
            step(model, x, label)

    def assertGraphError(self, message):
        return self.assertRaisesRegex(ot.GraphError,
                                      "^%s$" % _escape(message))

    def test_replay_before_capture_and_after_destroy(self):
        graph = ot.Graph()
        with self.assertGraphError("the graph was never captured; capture() "
                                   "it first (or use step())"):
            with graph.replay():
                pass
        model = one_run_mlp(True)
        x, label = batches(1)[0]
        self.capture(graph, model, x, label)
        with self.assertGraphError("the graph is already captured; replay() "
                                   "it, or capture a new Graph"):
            self.capture(graph, model, x, label)
        graph.destroy()
        self.assertTrue(graph.destroyed)
        self.assertEqual(self.session.stats()["graphs"], "0")
        for block in (graph.replay, graph.capture, graph.step):
            with self.assertGraphError("the graph was destroyed; capture a "
                                       "new opserver.torch.Graph"):
                with block():
                    step(model, x, label)

    def test_a_capture_inside_another_block(self):
        outer, inner = ot.Graph(), ot.Graph()
        model = one_run_mlp(True)
        x, label = batches(1)[0]
        with outer.capture():
            with self.assertGraphError(
                    "a graph block is already active in this thread (a "
                    "capture); graph blocks do not nest"):
                with inner.capture():
                    pass
            with self.assertGraphError("destroy() inside the graph's own "
                                       "block"):
                outer.destroy()
            # Another thread cannot enter this graph meanwhile.
            errors = []

            def replay():
                try:
                    with ot.remote(self.session), outer.replay():
                        pass
                except ot.GraphError as e:
                    errors.append(str(e))

            thread = threading.Thread(target=replay)
            thread.start()
            thread.join()
            self.assertEqual(errors, [
                "the graph is already in a block (another thread's?); one "
                "step at a time"])
            step(model, x, label)
        # The outer capture went on and is whole.
        self.assertEqual(outer.segments, [3])
        self.assertFalse(inner.captured)
        with outer.replay():
            step(model, x, label)

    def test_a_shape_change_on_replay(self):
        model = one_run_mlp(True)
        graph = ot.Graph()
        (x, label), = batches(1)
        self.capture(graph, model, x, label)
        with self.assertGraphError(
                "graph replay: remote forward 1 (HardswishFunction) was "
                "captured with FLOAT[32, 256] and now has FLOAT[16, 256]" +
                MISMATCH):
            with graph.replay():
                step(model, x[:16], label[:16])
        with self.assertGraphError(
                "graph replay: remote forward 1 (HardswishFunction) was "
                "captured with FLOAT[32, 256] and now has BFLOAT16[32, 256]" +
                MISMATCH):
            with graph.replay():
                model.to(torch.bfloat16)
                try:
                    step(model, x.to(torch.bfloat16), label)
                finally:
                    model.to(torch.float32)
        # The graph is as captured: the right shape replays, and gives
        # eager's gradients (from the same dropout masks).
        model.zero_grad()
        torch.manual_seed(5)
        with graph.replay():
            step(model, x, label)
        replayed = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        torch.manual_seed(5)
        step(model, x, label)
        self.assertSameParameters(replayed,
                                  [p.grad for p in model.parameters()])

    def test_other_steps_on_replay(self):
        model = one_run_mlp(True)
        graph = ot.Graph()
        (x, label), = batches(1)
        self.capture(graph, model, x, label)
        model[3].negative_slope = 0.1
        with self.assertGraphError(
                "graph replay: remote backward 1 (LeakyReluFunction) was "
                "captured with arguments (forward 3's tensor, 0.05, False) "
                "and now has (forward 3's tensor, 0.1, False)" + MISMATCH):
            with graph.replay():
                step(model, x, label)
        model[3].negative_slope = 0.05
        # The forward alone: the block ends short of the capture.
        with self.assertGraphError(
                "graph replay: the step made 3 remote forwards and 0 "
                "backwards in 0 segments, the capture 3, 3 and 1" + MISMATCH):
            with graph.replay():
                loss = torch.nn.functional.cross_entropy(model(x), label)
        with self.assertGraphError(
                "a remote backward ran after its graph block ended; run "
                "loss.backward() inside the block"):
            loss.backward()
        # One more remote module than at the capture.
        model.append(ot.nn.Hardswish())
        with self.assertGraphError(
                "graph replay: remote forward 4 (HardswishFunction) is one "
                "more than the capture's 3" + MISMATCH):
            with graph.replay():
                step(model, x, label)
        del model[-1]
        with graph.replay():
            step(model, x, label)

    def test_an_empty_capture_and_another_session(self):
        graph = ot.Graph()
        with self.assertGraphError(
                "the capture recorded no remote backward; run the step's "
                "forward and backward inside the block"):
            with graph.capture():
                pass
        self.assertFalse(graph.captured)
        other = self.client.session("other")
        self.addCleanup(other.close)
        x = torch.ones(4, requires_grad=True)
        with self.assertGraphError(
                "a remote module used another session than its graph's "
                "inside the graph's block; a graph holds one session's "
                "operators"):
            with graph.capture():
                ot.hardswish(x, session=other)
        # Nothing was left behind: the graph captures as new.
        with graph.capture():
            ot.hardswish(x).sum().backward()
        self.assertEqual(graph.segments, [1])
        self.assertTrue(torch.equal(x.grad, torch.ones(4) / 3 + 0.5))

    def test_the_session_level_graph_calls(self):
        s = self.session
        g = s.to_device(torch.full((8,), 2.0))
        x = s.to_device(torch.linspace(-4, 4, 8))
        out = s.empty([8], opserver.DType.FLOAT)
        recorder = s.record_graph()
        with self.assertRaisesRegex(opserver.InvalidArgument,
                                    "DefineGraph: a graph has no tasks"):
            recorder.define()
        executor = s.hardswish_backward(g, x, out=out, launch=False)
        recorder.launch(executor)
        self.assertEqual(len(recorder), 1)
        # Consumed into the recording, as a launch consumes it.
        with self.assertRaises(opserver.FailedPrecondition) as e:
            recorder.launch(executor)
        self.assertEqual((e.exception.aclnn_status, e.exception.message), (
            561103, "the executor was already consumed by a launch or a "
            "graph, or destroyed"))
        other = self.client.session("other")
        self.addCleanup(other.close)
        foreign = other.hardswish_backward(
            other.to_device(torch.ones(8)), other.to_device(torch.ones(8)),
            launch=False)
        with self.assertRaises(opserver.InvalidArgument) as e:
            recorder.launch(foreign)
        self.assertEqual(e.exception.message,
                         "the executor belongs to another session")
        graph = recorder.define()
        self.assertEqual(graph.tasks, 1)
        s.upload(out.buffer, torch.full((8,), -1.0))
        graph.replay()
        self.assertTrue(torch.equal(out.torch(), s.hardswish_backward(
            torch.full((8,), 2.0), torch.linspace(-4, 4, 8))))
        graph.destroy()
        self.assertTrue(graph.destroyed)
        with self.assertRaises(opserver.FailedPrecondition) as e:
            graph.replay()
        self.assertEqual(e.exception.message, "graph %d was destroyed; "
                         "define it again" % graph.handle)


class GraphLimitTest(testing.ServerTestCase):

    server_flags = ("--max_graphs_per_session=1",)

    def test_a_capture_past_the_servers_limits_fails_whole(self):
        """testing.mlp needs two graphs: the second definition is refused,
        and the capture with it, leaving no graph on the server."""
        graph = ot.Graph(self.session)
        model = testing.mlp(True)
        (x, label), = batches(1)
        with self.assertRaisesRegex(opserver.ResourceExhausted,
                                    "DefineGraph"):
            with graph.capture():
                step(model, x, label)
        self.assertFalse(graph.captured)
        self.assertEqual(self.session.stats()["graphs"], "0")
        # A model that needs one graph captures in the same session.
        model = one_run_mlp(True)
        with graph.capture():
            step(model, x, label)
        self.assertEqual(graph.segments, [3])


def _escape(text):
    import re
    return re.escape(text)


if __name__ == "__main__":
    testing.main()
