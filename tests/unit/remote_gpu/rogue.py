"""A scripted donor for the client's tests: it speaks the handshake itself (with or
without the lease's token) and then does whatever a test asks of a hostile or broken
donor. One connection, served in a thread, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

from remote_gpu import handshake
from remote_gpu.protocol import HEADER_SIZE, HELLO_KEY, MAX_META, SUPPORTED_VERSIONS, unpack
from remote_gpu.tokens import Token


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class Rogue:
    """Serves one connection: CHALLENGE, reads the HELLO (kept in ``hello_bytes``),
    then ``script(sock, session)``, where ``session`` holds the nonces and, if the rogue
    was given the ``token``, the session key."""

    def __init__(
        self, script: Callable[[socket.socket, dict[str, Any]], None], token: Token | None = None
    ) -> None:
        self.script = script
        self.token = token
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.hello_bytes = b""
        self.received = b""  # what the client sent after its HELLO, if the script reads
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.listener.settimeout(20)
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(20)
                server_nonce = secrets.token_bytes(handshake.NONCE_SIZE)
                header, meta = handshake.challenge_frame(sorted(SUPPORTED_VERSIONS), server_nonce)
                conn.sendall(header + meta)
                raw = recv_exact(conn, HEADER_SIZE)
                hello_head = unpack(raw, HELLO_KEY, MAX_META)
                meta = recv_exact(conn, hello_head.length)
                self.hello_bytes = raw + meta
                hello, _, _ = handshake.parse_hello(hello_head, raw, meta)
                session: dict[str, Any] = {
                    "hello": hello,
                    "client_nonce": bytes.fromhex(hello.nonce),
                    "server_nonce": server_nonce,
                }
                if self.token is not None:
                    from remote_gpu.protocol import session_key

                    session["key"] = session_key(
                        self.token.mac_bytes, session["client_nonce"], server_nonce
                    )
                self.script(conn, session)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()
        self._thread.join(30)


def accept_frame(session: dict[str, Any], lease: int, key: bytes, **fields: Any) -> bytes:
    """A donor's reply for the client of ``session``, proven with ``key``."""
    body = {
        "version": max(SUPPORTED_VERSIONS),
        "donor": "rogue",
        "credits": 1,
        "transport": "tcp",
        "slot_size": 1 << 16,
        "functions": ["echo"],
        **fields,
    }
    accept = handshake.Accept.model_construct(**body)  # unchecked: rogues lie
    header, meta = handshake.accept_frame(accept, lease, key, session["client_nonce"])
    return header + meta
