"""What the Python tests share: a sanitizer-aware start, and an opserver
binary on a free loopback port.

    import testing
    testing.prepare()          # first: may re-execute the test (ASan)
    with testing.Server(binary) as server:
        client = opserver.connect(server.address)
"""

import faulthandler
import os
import re
import subprocess
import sys
import time
import unittest


def prepare(timeout_s=600):
    """Re-executes the test with the sanitizer runtimes preloaded when the
    extension was built with them (--config=asan): an ASan library loaded
    into an interpreter that was not started with ASan aborts. Leak checking
    is off, since the interpreter keeps its objects to the end. Also dumps
    every thread's stack and exits if the test runs past `timeout_s`, so a
    hang is reported, not waited for."""
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    if os.environ.get("OPSERVER_SANITIZERS_PRELOADED"):
        return
    import importlib.util
    spec = importlib.util.find_spec("opserver")
    extension = os.path.join(os.path.dirname(spec.origin), "_opserver.so")
    libs = subprocess.run(["ldd", extension], capture_output=True,
                          text=True).stdout
    preload = re.findall(r"=> (\S*lib(?:asan|ubsan)\.so\S*)", libs)
    if not preload:
        return
    env = dict(os.environ, OPSERVER_SANITIZERS_PRELOADED="1",
               LD_PRELOAD=":".join(preload),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


class Server:
    """The opserver binary on 127.0.0.1:0 with `flags`; stopped (SIGTERM,
    then SIGKILL) when the block ends. ``address`` is HOST:PORT."""

    def __init__(self, binary, *flags):
        tmp = os.environ.get("TEST_TMPDIR", "/tmp")
        self._log = open(os.path.join(tmp, "opserver-%d.log" % os.getpid()),
                         "ab")
        self.process = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0"] + list(flags),
            stdout=subprocess.PIPE, stderr=self._log)
        self.address = None
        self.metrics_address = None  # With --metrics_listen.
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.process.stdout.readline().decode()
            if not line:
                break
            m = re.match(r"metrics on (\S+)$", line.strip())
            if m:
                self.metrics_address = m.group(1)
            m = re.match(r"listening on (127\.0\.0\.1:\d+)$", line.strip())
            if m:
                self.address = m.group(1)
                break
        if self.address is None:
            self.stop()
            raise RuntimeError("opserver did not start; see its log in " +
                               self._log.name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def kill(self):
        """SIGKILL: the server is gone at once."""
        self.process.kill()
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self._log.close()


def _free_ports(count):
    """`count` distinct loopback ports the kernel picked as free (bound at
    once, then closed: another process may take one before it is used)."""
    import socket
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Etcd:
    """Debian's etcd (/usr/bin/etcd) on loopback, with its data and log in
    `directory`, as testing/etcd_process.cc starts it for the C++ tests:
    free ports, started again on new ones (a few times) when etcd exits
    because one was taken meanwhile. ``endpoint`` is 127.0.0.1:PORT;
    serving once its /health answers (it elected itself leader)."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self._log = open(os.path.join(directory, "etcd.log"), "ab")
        self.process = None
        for _ in range(5):
            client, peer = _free_ports(2)
            client_url = "http://127.0.0.1:%d" % client
            peer_url = "http://127.0.0.1:%d" % peer
            self.process = subprocess.Popen(
                ["/usr/bin/etcd", "--name=test",
                 "--data-dir=" + os.path.join(directory, "etcd-data"),
                 "--listen-client-urls=" + client_url,
                 "--advertise-client-urls=" + client_url,
                 "--listen-peer-urls=" + peer_url,
                 "--initial-advertise-peer-urls=" + peer_url,
                 "--initial-cluster=test=" + peer_url],
                stdout=self._log, stderr=self._log)
            if self._wait_serving(client_url):
                self.endpoint = "127.0.0.1:%d" % client
                return
        self.stop()
        raise RuntimeError("etcd did not start; see " + self._log.name)

    def _wait_serving(self, url):
        import json
        import urllib.request
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.process.poll() is not None:
                return False  # Exited: a port was taken.
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return True
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        self.process.kill()
        self.process.wait()
        return False

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def _varint(n):
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _download_request(session, buffer, size, stream):
    """A DownloadRequest on the wire: session (1), buffer (2), size (4),
    stream (5). The package speaks to the server through its C++ client,
    so the tests carry no generated Python messages."""
    token = session.encode()
    return (b"\x0a" + _varint(len(token)) + token + b"\x10" +
            _varint(buffer) + b"\x20" + _varint(size) + b"\x28" +
            _varint(stream))


def _download_data_size(message):
    """The size of a DownloadResponse's data (field 1), read off the wire."""
    if not message:
        return 0
    assert message[0] == 0x0A, "not a DownloadResponse: %r" % message[:8]
    size, shift, at = 0, 0, 1
    while True:
        byte = message[at]
        size |= (byte & 0x7F) << shift
        shift, at = shift + 7, at + 1
        if not byte & 0x80:
            break
    assert at + size == len(message), "a DownloadResponse of one field"
    return size


class HeldStream:
    """A gate on one of a session's streams, for tests that must know the
    order of events: a raw gRPC Download of `buffer` (at least a few chunks
    long) is queued on the stream, and once its first chunk is here the
    stream has reached it; the download then holds the stream, since this
    side reads nothing more and the channel's flow-control window (fixed:
    no bandwidth probing) is far smaller than the rest. Work queued on the
    stream later waits until ``release()`` reads the rest.

        with testing.HeldStream(server.address, session, buffer, nbytes):
            ...  # the stream is held here
    """

    def __init__(self, address, session, buffer, nbytes, stream=0):
        import grpc
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.http2.bdp_probe", 0),
                              ("grpc.max_receive_message_length", -1)])
        download = self._channel.unary_stream(
            "/opserver.v1.Runtime/Download")
        self._chunks = download(
            _download_request(session.token, buffer.handle, nbytes, stream),
            timeout=600)
        self.first_chunk = _download_data_size(next(self._chunks))

    def release(self):
        """Reads the rest of the download; returns the bytes of data it
        received in all."""
        if self._chunks is None:
            return 0
        received = self.first_chunk + sum(
            _download_data_size(c) for c in self._chunks)
        self._chunks = None
        self._channel.close()
        return received

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False


class ServerTestCase(unittest.TestCase):
    """A server per test class (the binary `main` takes from argv[1], with
    the class's `server_flags`), ``self.client`` on it, and a new
    ``self.session`` per test, closed after it."""

    binary = None
    server_flags = ()

    @classmethod
    def setUpClass(cls):
        import opserver  # After prepare(): it loads the extension.
        cls.server = Server(cls.binary, *cls.server_flags)
        cls.client = opserver.connect(cls.server.address)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def setUp(self):
        self.session = self.client.session(self.id())
        self.addCleanup(self.session.close)


def main():
    """unittest.main() for tests taking the opserver binary as argv[1]."""
    ServerTestCase.binary = sys.argv.pop(1)
    unittest.main()


def mlp(remote):
    """The MLP the tests and python_step_bench train: 784-256-128-10 with
    Hardswish, Dropout and LeakyReLU, opserver.torch.nn's (remote) or
    torch.nn's, from the same seed."""
    import torch
    import opserver.torch as ot
    nn = ot.nn if remote else torch.nn
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), nn.Hardswish(), nn.Dropout(0.2),
        torch.nn.Linear(256, 128), nn.LeakyReLU(0.05),
        torch.nn.Linear(128, 10))
