"""connect(): a Client of one server, or a Pool of an etcd registry's."""

import json

from opserver import _opserver
from opserver._session import Session
from opserver.errors import InvalidArgument


class Client:
    """A connection to one opserver. Made by ``connect``."""

    def __init__(self, client):
        self._c = client

    @property
    def address(self):
        return self._c.address

    def device_info(self):
        return json.loads(self._c.device_info())

    def health(self, service=""):
        return self._c.health(service)

    def session(self, name="python", attach=True, device=0):
        """Opens a session; use it as a context manager to close it. With
        `attach`, the server also frees it if this process dies. `device` is
        the server's device the session runs on (an index into
        ``device_info()["devices"]``)."""
        return Session(self._c.create_session(name, attach, device))


class Pool:
    """The devices of a pool of opservers registered in etcd, as one list of
    ordinals: the C API's for the same OPSERVER_ADDRESS (docs/pool.md).
    Made by ``connect("etcd://HOST:PORT/PREFIX")``. With a claim, the
    ordinals are exactly the claimed devices, held until ``close()`` (or
    until the pool is garbage, or the process dies: the claim's lease)."""

    def __init__(self, address, device_set):
        self._address = address
        self._d = device_set

    @property
    def address(self):
        return self._address

    def __len__(self):
        return self._d.size

    @property
    def devices(self):
        """One dict per ordinal, in order: ``address`` (the server),
        ``device`` (its index there) and ``info`` (the server's
        DeviceInfo)."""
        devices = []
        for ordinal in range(self._d.size):
            address, device, info = self._d.device(ordinal)
            devices.append({"address": address, "device": device,
                            "info": json.loads(info)})
        return devices

    def session(self, name="python", attach=True, device=0):
        """Opens a session on pool ordinal `device`; as ``Client.session``.
        Raises ``opserver.InvalidArgument`` naming the count past the last
        ordinal."""
        return Session(self._d.create_session(device, name, attach))

    def close(self):
        """Releases the claim now: its devices are free for other jobs.
        Sessions already open go on. Without a claim, does nothing."""
        self._d.release_claim()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_ETCD_SCHEME = "etcd://"


def connect(address, *, tls_ca_file=None, tls_cert_file=None,
            tls_key_file=None, tls_server_name=None, token=None,
            pipeline=True, data_path=True, keep_data_connections=True,
            connect_timeout=5.0,
            call_timeout=30.0, wait_timeout=600.0, transfer_connections=None,
            transfer_idle_timeout=None, max_message_bytes=None, claim=None,
            claim_wait_s=None, claim_ttl_s=None):
    """Connects to the opserver at HOST:PORT and waits until it answers.

    TLS is used when any tls_* file is given (the CA that signed the
    server's certificate; a certificate and key for mTLS). `token` is sent
    as a bearer token with every call. `pipeline=False` makes every call
    its own RPC (for debugging). `data_path=False` keeps every transfer on
    gRPC; `keep_data_connections=False` opens a data connection per
    transfer instead of keeping one for the next. Timeouts are in seconds;
    `transfer_idle_timeout` (default 60) ends a transfer that moves no data
    for that long with ``opserver.DeadlineExceeded``. Raises
    ``opserver.InvalidArgument`` for an address that is not HOST:PORT, and
    ``opserver.Unavailable`` naming the cause when no server answers: at
    once for a refused connection or a failed handshake, after
    `connect_timeout` for a host that does not answer.

    ``etcd://HOST:PORT[,HOST:PORT...]/PREFIX`` gives a ``Pool`` of the
    devices opservers registered there (``--register``), in the C API's
    order; the other options apply to every server. `claim=N` claims N
    free devices, which are then the pool's ordinals (``ResourceExhausted``
    when fewer are free, after waiting `claim_wait_s` seconds);
    `claim_ttl_s` is how long a dead job's claim lasts (default 10). Each
    one not given is read from OPSERVER_CLAIM, OPSERVER_CLAIM_WAIT_S and
    OPSERVER_CLAIM_TTL_S, as the C API does; etcd's TLS and user come from
    OPSERVER_ETCD_* (docs/pool.md).
    """
    options = dict(
        tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file, tls_server_name=tls_server_name,
        token=token, pipeline=pipeline, data_path=data_path,
        keep_data_connections=keep_data_connections,
        connect_timeout=connect_timeout, call_timeout=call_timeout,
        wait_timeout=wait_timeout, transfer_connections=transfer_connections,
        transfer_idle_timeout=transfer_idle_timeout,
        max_message_bytes=max_message_bytes)
    if address.startswith(_ETCD_SCHEME):
        return Pool(address, _opserver.DeviceSet.connect(
            address, claim=claim, claim_wait_s=claim_wait_s,
            claim_ttl_s=claim_ttl_s, **options))
    for name, value in (("claim", claim), ("claim_wait_s", claim_wait_s),
                        ("claim_ttl_s", claim_ttl_s)):
        if value is not None:
            raise InvalidArgument(3, 161002, "%s= needs an etcd:// address "
                                  "(a pool); %s is one server" %
                                  (name, address))
    return Client(_opserver.Client.connect(address, **options))
