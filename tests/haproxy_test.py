"""Debian's HAProxy with deploy/haproxy/haproxy.cfg, unchanged, in front of
two opservers (docs/pool.md, "A proxy in front of several servers"):
sessions of the C API, the C++ client and Python at once, each with every
call kind, stay on one server and both servers are used; a misrouted call
is NOT_FOUND naming the routing key; `set server ... state drain` keeps open
sessions on their server and sends new ones to the other; opserver's own
--drain_s answers NOT_SERVING meanwhile. And a download goes through while
an upload to the same server is held (HAProxy 2.6 stalls a whole HTTP/2
connection behind a stream it cannot forward: the client keeps uploads and
downloads on connections of their own).

argv: opserver, a C API example (threshold_backward), the C++ client
example, deploy/haproxy/haproxy.cfg. Everything is written under
$TEST_TMPDIR; no fixed ports (HAProxy's front port is picked free and tried
again if it was taken meanwhile)."""

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import unittest

import testing

testing.prepare()

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import opserver  # noqa: E402

OPSERVER, CAPI_EXAMPLE, CPP_EXAMPLE, CONFIG = sys.argv[1:5]
del sys.argv[1:5]
TMP = os.environ.get("TEST_TMPDIR", "/tmp")
HAPROXY = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin:/bin")
# threshold_backward's worked example, as examples/examples_test.sh checks.
EXPECTED = "0.000000 4.400000 4.300000 4.200000"
# The calls that belong to no session, the only ones without a key.
SESSIONLESS = {"GetDeviceInfo", "ListOperators", "GetServerStats",
               "Evaluate", "Check", "Watch", "ServerReflectionInfo"}
KEY_REFUSED = re.compile(r"no session with routing key ([0-9a-f]{32}) "
                         r"\(x-opserver-session\) on this server")


def until(what, condition, timeout_s=60):
    """Polls `condition` until it is true, at most `timeout_s`."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def join_or_fail(test, threads, what, timeout_s=300):
    """Joins `threads` (daemons) within `timeout_s` in all; fails at once,
    naming `what` and where each thread left behind waits, rather than
    hanging the suite until its own timeout."""
    deadline = time.time() + timeout_s
    for t in threads:
        t.join(max(0, deadline - time.time()))
    stuck = [t for t in threads if t.is_alive()]
    if stuck:
        frames = sys._current_frames()
        where = "\n".join("%s:\n%s" % (t.name, "".join(
            traceback.format_stack(frames[t.ident])) if t.ident in frames
            else "?") for t in stuck)
        test.fail("%s: %d thread(s) still running after %d s:\n%s" %
                  (what, len(stuck), timeout_s, where))


def demux_blocked(proxy):
    """True when one of HAProxy's HTTP/2 connections has stopped reading
    because a stream's buffer is full and cannot be forwarded
    (H2_CF_DEM_SFULL, 0x80, in `show fd`'s .flg): every frame behind it on
    that connection, window updates included, waits."""
    flags = re.findall(r"h2c\.st0=\S+ .*?\.flg=0x([0-9a-f]+)",
                       proxy.admin("show fd"))
    return any(int(f, 16) & 0x80 for f in flags)


def varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def session_stats(address, session, key=None):
    """A raw Runtime/GetSessionStats on `address` for `session`, with
    `key` as x-opserver-session when given (the way grpcurl or another
    client would send it). Returns the grpc status code and details."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/opserver.v1.Runtime/GetSessionStats")
        token = session.encode()
        metadata = (("x-opserver-session", key),) if key else ()
        try:
            call(b"\x0a" + varint(len(token)) + token, metadata=metadata,
                 timeout=30)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()


_proxies = [0]


def proxy_seq():
    """A number per proxy started, for its file and socket names."""
    _proxies[0] += 1
    return _proxies[0]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """HAProxy with CONFIG in front of `backends` (HOST:PORT each); the
    config's `stick on` line dropped when not `sticky` (the control that
    shows the test sees misrouting)."""

    def __init__(self, backends, sticky=True):
        if HAPROXY is None:
            raise RuntimeError(
                "haproxy is not installed: run scripts/install-deps.sh")
        config = CONFIG
        if not sticky:
            config = os.path.join(TMP, "haproxy-unsticky.cfg")
            with open(CONFIG) as f, open(config, "w") as out:
                text = f.read()
                assert "stick on req.hdr(x-opserver-session)" in text
                out.write(text.replace("stick on", "# stick on"))
        # The admin socket in the abstract namespace: $TEST_TMPDIR is longer
        # than a socket path may be, and nothing lands on disk. HAProxy pads
        # abstract names to the whole sun_path with NULs. Random, not the
        # pid: abstract names are shared by the whole network namespace,
        # and tests run in parallel in sandboxes whose pids repeat, where
        # one run's readiness check then asked another run's HAProxy.
        seq = proxy_seq()
        self.admin_name = "opserver-haproxy-test-%s-%d" % (
            secrets.token_hex(8), seq)
        self.log = open(os.path.join(TMP, "haproxy-%d.log" % seq), "ab")
        # The config's one line per call (stdout).
        self.calls_path = os.path.join(TMP, "haproxy-calls-%d.log" % seq)
        self.calls_log = open(self.calls_path, "wb")
        for _ in range(10):
            port = free_port()
            env = dict(os.environ, OPSERVER_HAPROXY_BIND="127.0.0.1:%d" % port,
                       OPSERVER_HAPROXY_ADMIN="abns@" + self.admin_name,
                       OPSERVER_BACKEND_1=backends[0],
                       OPSERVER_BACKEND_2=backends[1])
            self.process = subprocess.Popen(
                [HAPROXY, "-db", "-f", config], env=env,
                stdout=self.calls_log, stderr=self.log)
            if self._ready():
                self.address = "127.0.0.1:%d" % port
                return
            # The port was taken meanwhile (or it did not come up): again.
            self.process.kill()
            self.process.wait()
        raise RuntimeError("haproxy did not start; see " + self.log.name)

    def _ready(self):
        deadline = time.time() + 60
        while time.time() < deadline and self.process.poll() is None:
            try:
                state = self.admin("show servers state opservers")
            except OSError:
                state = ""
            # srv_op_state (the 6th field) 2: running, for both servers.
            # (After a line with the format's version, and the header.)
            rows = [r for r in (l.split() for l in state.splitlines())
                    if len(r) > 5 and r[0].isdigit()]
            if len(rows) == 2 and all(r[5] == "2" for r in rows):
                return True
            time.sleep(0.05)
        return False

    def admin(self, command):
        name = b"\0" + self.admin_name.encode()
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(name + b"\0" * (108 - len(name)))
            s.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode()
                chunks.append(chunk)

    def calls(self):
        """(server, key or None, method) of each call logged so far."""
        with open(self.calls_path) as f:
            # Also HAProxy's own lines ("Proxy opserver started."): skipped.
            rows = [r for r in (line.split() for line in f) if len(r) == 3]
        return [(server.split("/")[-1], None if key == "-" else key,
                 path.rsplit("/", 1)[-1])
                for server, key, path in rows
                if server.startswith("opservers/") and path.startswith("/")]

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)
        self.log.close()
        self.calls_log.close()


class HaproxyTest(unittest.TestCase):

    def start_proxy(self, sticky=True, drain_s=0, flags=()):
        """Two opservers (s1 draining for up to `drain_s` on SIGTERM; both
        with `flags`) and the proxy in front of them."""
        flags = ("--device_memory_bytes=1073741824",) + tuple(flags)
        self.servers = [
            testing.Server(OPSERVER, "--drain_s=%d" % drain_s, *flags),
            testing.Server(OPSERVER, *flags)]
        self.addCleanup(lambda: [s.stop() for s in self.servers])
        self.backends = [s.address for s in self.servers]
        proxy = Proxy(self.backends, sticky)
        self.addCleanup(proxy.stop)
        return proxy

    def owner(self, session):
        """The index of the backend that holds `session`: the one that
        knows its id (asked without a key, as grpcurl would)."""
        found = [i for i, address in enumerate(self.backends)
                 if session_stats(address, session.token)[0] ==
                 grpc.StatusCode.OK]
        self.assertEqual(len(found), 1, found)
        return found[0]

    def work(self, s, size=8 << 20):
        """Every call kind on session `s`: a pipelined operator (plan,
        launch, writes and reads on the channel), a stream, stats, and a
        large upload and download (the data path's ticket, or split gRPC
        transfers over several connections)."""
        got = s.threshold_backward(np.float32([4.5, 4.4, 4.3, 4.2]),
                                   np.float32([0.2, 1.2, 2.2, 3.2]), 1.0)
        np.testing.assert_array_equal(got, np.float32([0, 4.4, 4.3, 4.2]))
        stream = s.create_stream()
        data = np.frombuffer(secrets.token_bytes(size), np.uint8)
        buffer = s.malloc(size)
        s.upload(buffer, data, stream=stream)
        out = np.empty_like(data)
        s.download(buffer, out, stream=stream)
        np.testing.assert_array_equal(out, data)
        s.synchronize(stream)
        self.assertGreaterEqual(int(s.stats()["buffers"]), 1)
        buffer.free()
        s.flush()

    def run_examples(self, address, count):
        """`count` runs each of the C API and C++ client examples against
        `address`, all at once; returns (name, rc, output) for each."""
        env = dict(os.environ, OPSERVER_ADDRESS=address)
        procs = []
        for i in range(count):
            for name, argv in (("capi", [CAPI_EXAMPLE]),
                               ("cpp", [CPP_EXAMPLE, address])):
                out = open(os.path.join(TMP, "%s-%d.out" % (name, i)), "w+")
                procs.append((name, out, subprocess.Popen(
                    argv, env=env, stdout=out, stderr=subprocess.STDOUT)))
        results = []
        for name, out, proc in procs:
            rc = proc.wait(300)
            out.seek(0)
            results.append((name, rc, out.read()))
            out.close()
        return results

    def test_every_clients_sessions_stay_on_one_server(self):
        proxy = self.start_proxy()
        ticketed = opserver.connect(proxy.address)
        # Transfers through gRPC, split over four connections: each part's
        # call must reach the session's server too.
        split = opserver.connect(proxy.address, data_path=False,
                                 transfer_connections=4)
        # Made one after the other: round robin alternates the servers.
        sessions = [c.session("py-%d" % i) for i in range(4)
                    for c in (ticketed, split)]
        owners = [self.owner(s) for s in sessions]
        self.assertEqual(set(owners), {0, 1}, owners)
        errors = []

        def run(s):
            # Split: past transfer_split_bytes (32 MiB).
            size = (8 << 20) if s in sessions[::2] else (33 << 20)
            try:
                for _ in range(2):
                    self.work(s, size)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append("%s: %r" % (s.token, e))

        threads = [threading.Thread(target=run, args=(s,), daemon=True,
                                    name=s.token) for s in sessions]
        for t in threads:
            t.start()
        results = self.run_examples(proxy.address, 3)
        join_or_fail(self, threads, "the Python sessions' work")
        self.assertEqual(errors, [])
        for name, rc, output in results:
            self.assertEqual(rc, 0, "%s: %s" % (name, output))
            got = " ".join(re.findall(r"^result\[\d+\] is: (.*)$", output,
                                      re.M))
            self.assertEqual(got, EXPECTED, "%s: %s" % (name, output))
        # Still where they were made, and none lost its Attach call.
        self.assertEqual([self.owner(s) for s in sessions], owners)
        for s in sessions:
            self.assertIsNone(s.lost())
            s.close()
        self.check_call_log(proxy, sessions, owners)

    def check_call_log(self, proxy, sessions, owners):
        """The proxy's own record: every call of a session carried its key
        and reached one server; the Python sessions' calls include every
        kind (their Attach and Pipeline calls are logged when they end,
        after close: polled for)."""
        kinds = {"CreateSession", "Attach", "Pipeline", "CreateStream",
                 "Malloc", "OpenDataTransfer", "Upload", "Download",
                 "SynchronizeStream", "GetSessionStats", "CloseSession"}

        def logged():
            seen = {}
            for _, key, method in proxy.calls():
                seen.setdefault(key, set()).add(method)
            return all(kinds - {"OpenDataTransfer"} <= seen.get(s.routing_key,
                                                                 set())
                       for s in sessions) and seen

        seen = until("every call kind in the proxy's log", logged)
        # Data path (ticket) for the first client's, split gRPC for the
        # second's.
        for s in sessions[::2]:
            self.assertIn("OpenDataTransfer", seen[s.routing_key])
        server_of = {}
        for server, key, method in proxy.calls():
            if key is None:
                self.assertIn(method, SESSIONLESS, "a session's call without "
                              "its key: " + method)
                continue
            server_of.setdefault(key, set()).add(server)
        for key, servers in server_of.items():
            self.assertEqual(len(servers), 1, "key %s on %s" % (key, servers))
        for s, owner in zip(sessions, owners):
            self.assertEqual(server_of[s.routing_key], {"s%d" % (owner + 1)})
        # The C API's and C++ client's sessions too: 6 more keys.
        self.assertEqual(len(server_of), len(sessions) + 6)

    def test_without_the_stick_table_calls_are_misrouted_and_say_so(self):
        """The control: the same proxy without `stick on` alternates a
        session's calls over the servers, and the second call is refused
        naming the session's routing key."""
        proxy = self.start_proxy(sticky=False)
        client = opserver.connect(proxy.address, pipeline=False)
        s = client.session("unrouted", attach=False)
        with self.assertRaises(opserver.NotFound) as refused:
            s.malloc(16)
        self.assertIn("no session with routing key %s (x-opserver-session) "
                      "on this server" % s.routing_key, str(refused.exception))
        self.assertNotIn(s.token, str(refused.exception))

    def test_a_misrouted_call_is_not_found_naming_the_routing_key(self):
        proxy = self.start_proxy()
        client = opserver.connect(proxy.address)
        s = client.session("routed")
        key = s.routing_key
        self.assertRegex(key, r"^[0-9a-f]{32}$")
        self.assertNotIn(key, s.token)
        home = self.owner(s)
        other = self.backends[1 - home]
        # Its own key, on the server that did not create it.
        code, details = session_stats(other, s.token, key)
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(KEY_REFUSED.search(details).group(1), key, details)
        self.assertNotIn(s.token, details)
        # Another key, on its own server and through the proxy.
        wrong = secrets.token_hex(16)
        for address in (self.backends[home], proxy.address):
            code, details = session_stats(address, s.token, wrong)
            self.assertEqual(code, grpc.StatusCode.NOT_FOUND, address)
            self.assertEqual(KEY_REFUSED.search(details).group(1), wrong,
                             details)
        # No key at all (grpcurl, older clients): not checked.
        self.assertEqual(session_stats(self.backends[home], s.token)[0],
                         grpc.StatusCode.OK)
        self.work(s)
        s.close()

    def test_a_download_goes_through_while_an_upload_is_held(self):
        """One client, two sessions on one server. Session a's upload waits
        on the server (its stream is busy with a download the test does not
        read yet: the gate) until HAProxy has stopped reading the client
        connection that carries it (a stream buffer full that it cannot
        forward). Session b's download must still complete, and a's upload
        once the gate opens. With both on one client connection, b's window
        updates queued there behind a's data, which HAProxy does not read
        until the server takes it: the download never finished (nor did
        the upload once the gate opened: the server's window updates for
        it queued behind the download's data on HAProxy's connection to
        the server). The hang of the first test, held in order."""
        # The gate is a download the test does not read: the servers' own
        # idle timeout (60 s by default) must not end it meanwhile.
        proxy = self.start_proxy(flags=("--transfer_idle_timeout_s=600",))
        client = opserver.connect(proxy.address, data_path=False,
                                  transfer_connections=1)
        # Two of three sessions share a server.
        sessions = [client.session("held-%d" % i) for i in range(3)]
        owners = [self.owner(s) for s in sessions]
        home = max(set(owners), key=owners.count)
        a, b = [s for s, o in zip(sessions, owners) if o == home][:2]
        size = 64 << 20  # Far beyond any flow-control window.
        gate_buffer, target = a.malloc(size), a.malloc(size)
        a_stream = a.create_stream()
        down = np.frombuffer(secrets.token_bytes(size), np.uint8)
        b_buffer = b.malloc(size)
        b.upload(b_buffer, down)
        # The gate: a download on a's stream, straight from its server, not
        # read past its first chunk: the stream stays busy, so an upload
        # queued behind it is not read.
        token = a.token.encode()
        request = (b"\x0a" + varint(len(token)) + token +
                   b"\x10" + varint(gate_buffer.handle) +
                   b"\x20" + varint(size) + b"\x28" + varint(a_stream.handle))
        gate_channel = grpc.insecure_channel(
            self.backends[home],
            options=[("grpc.max_receive_message_length", -1)])
        self.addCleanup(gate_channel.close)
        gate = gate_channel.unary_stream("/opserver.v1.Runtime/Download")(
            request, metadata=(("x-opserver-session", a.routing_key),),
            timeout=300)
        next(gate)
        errors = []

        def run(what, call):
            try:
                call()
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append("%s: %r" % (what, e))

        up = np.frombuffer(secrets.token_bytes(size), np.uint8)
        uploading = threading.Thread(
            target=run, name="upload", daemon=True,
            args=("upload", lambda: a.upload(target, up, stream=a_stream)))
        uploading.start()
        until("HAProxy to stop reading the upload's connection",
              lambda: demux_blocked(proxy))
        got = np.empty_like(down)
        downloading = threading.Thread(
            target=run, name="download", daemon=True,
            args=("download", lambda: b.download(b_buffer, got)))
        downloading.start()
        join_or_fail(self, [downloading],
                     "b's download while a's upload was held", 120)
        self.assertEqual(errors, [])
        np.testing.assert_array_equal(got, down)
        for _ in gate:  # Opens the gate: the rest of the gate's download.
            pass
        join_or_fail(self, [uploading], "a's upload once the gate opened",
                     120)
        self.assertEqual(errors, [])
        back = np.empty_like(up)
        a.download(target, back, stream=a_stream)
        np.testing.assert_array_equal(back, up)
        for s in sessions:
            s.close()

    def test_drain_keeps_open_sessions_and_sends_new_ones_elsewhere(self):
        proxy = self.start_proxy(drain_s=300)
        client = opserver.connect(proxy.address)
        first = [client.session("before-%d" % i) for i in range(2)]
        owners = [self.owner(s) for s in first]
        self.assertEqual(sorted(owners), [0, 1])
        kept = first[owners.index(0)]
        reply = proxy.admin("set server opservers/s1 state drain")
        self.assertEqual(reply.strip(), "")
        later = [client.session("after-%d" % i) for i in range(4)]
        self.assertEqual([self.owner(s) for s in later], [1, 1, 1, 1])
        self.work(kept)  # Still on s1, every call kind.
        self.assertEqual(self.owner(kept), 0)

        # opserver's own drain on s1: NOT_SERVING, no new sessions, the
        # open one served until it closes, then the process exits.
        drained = self.servers[0]
        direct = opserver.connect(drained.address)
        self.assertEqual(direct.health(), "SERVING")
        for s in first + later:
            if s is not kept:
                s.close()
        direct_session = direct.session("direct")  # Open before SIGTERM.
        drained.process.send_signal(signal.SIGTERM)
        until("NOT_SERVING", lambda: direct.health() == "NOT_SERVING")
        with self.assertRaises(opserver.Unavailable) as refused:
            direct.session("too-late")
        self.assertIn("server draining", str(refused.exception))
        self.work(kept)
        self.assertEqual(self.owner(kept), 0)
        direct_session.close()
        self.assertIsNone(drained.process.poll())  # `kept` is still open.
        kept.close()
        self.assertEqual(drained.process.wait(60), 0)


if __name__ == "__main__":
    unittest.main()
