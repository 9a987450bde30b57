"""store/embedded.py subclasses fakeredis's private TCP server. pyproject.toml bounds fakeredis from above; this
test pins the private names and signatures the subclasses rely on, so a fakeredis that moves them fails here (and
the bound can be raised only after this passes), not in a user's `rollq demo`."""

from __future__ import annotations

import inspect
import re
import socketserver
from importlib.metadata import version
from pathlib import Path

import redis
from fakeredis._clients._tcp_server import TCPFakeRequestHandler, TcpFakeServer, encode_reply
from fakeredis._typing import RaiseErrorTypes

from rollq.store.embedded import EmbeddedRedis

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_fakeredis_has_an_upper_bound_the_installed_version_meets() -> None:
    spec = re.search(r'"fakeredis\[lua\]>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert spec is not None, "fakeredis needs an upper bound in pyproject.toml"
    installed = tuple(int(p) for p in version("fakeredis").split(".")[:2])
    below = tuple(int(p) for p in spec.group(2).split("."))[:2]
    assert installed < below


def test_the_request_handler_hooks_embedded_overrides_keep_their_signatures() -> None:
    assert issubclass(TCPFakeRequestHandler, socketserver.StreamRequestHandler)
    for name in ("setup", "handle", "finish"):
        assert str(inspect.signature(getattr(TCPFakeRequestHandler, name))) == "(self) -> 'None'", name
    assert isinstance(inspect.getattr_static(TCPFakeRequestHandler, "protocol_version"), property)
    assert "self.current_client" in inspect.getsource(TCPFakeRequestHandler.setup)


def test_the_server_and_reply_encoding_keep_their_signatures() -> None:
    init = inspect.signature(TcpFakeServer.__init__)
    assert list(init.parameters)[:3] == ["self", "server_address", "bind_and_activate"]
    assert list(inspect.signature(encode_reply).parameters) == ["value", "protocol", "nested"]
    assert set(RaiseErrorTypes) >= {redis.ResponseError}


def test_the_fake_socket_methods_embedded_wraps_are_there_on_a_live_connection() -> None:
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        tcp = server._tcp_server
        assert tcp is not None and not tcp._shutdown_event.is_set() and tcp.fake_server is server.fake_server
        (handler_socket,) = list(tcp.clients.values())
        fake_socket = handler_socket.get_socket()
        assert list(inspect.signature(fake_socket._process_command).parameters) == ["fields"]
        assert list(inspect.signature(fake_socket.put_response).parameters) == ["msg"]
        assert list(inspect.signature(fake_socket.sendall).parameters) == ["data"]
        assert list(inspect.signature(handler_socket.can_read).parameters) == ["timeout"]
        # A command that crashes inside fakeredis must stay an error reply on a live connection.
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
