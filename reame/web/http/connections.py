"""Connections that keep the port usable: uvicorn's HTTP protocol with limits.

uvicorn keeps any connection open as long as its client wants: one that never finishes its
request's headers (half-sent), or a thousand idle ones from one address, use up the process's
open files (systemd's default limit is 1,024) and everyone else times out. Here:

- a connection must finish each request's headers within HEADERS_S of its last request (or
  of its opening); otherwise it is closed;
- one address may hold PER_ADDRESS connections at once, and the server TOTAL; a connection
  beyond is closed at once. The trusted proxies (`[server] trusted_proxies`) are not counted
  per address: all their clients share their address (the proxy limits them: nginx's
  limit_conn);
- the service unit raises LimitNOFILE above TOTAL, with room for the database and KV files.

And a stop that does not wait for streams with no end of their own: at a shutdown (SIGTERM,
Ctrl-C) uvicorn waits for every open response, and an open page or API client always holds
one (Gradio's heartbeat). A response already streaming is ended as if its client had hung
up: the server stops in a fraction of a second instead of after its graceful timeout, and a
reply being streamed stops as when its client hangs up (its slot freed, its words kept).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from uvicorn.protocols.http.h11_impl import H11Protocol

from reame.config.connection_limits import HEADERS_S, PER_ADDRESS, TOTAL


def limited_protocol(*, exempt: frozenset[str] = frozenset(), per_address: int = PER_ADDRESS,
                     total: int = TOTAL, headers_s: float = HEADERS_S) -> type[H11Protocol]:
    """uvicorn's h11 protocol class with these limits (pass it as uvicorn's `http`)."""
    open_from: Counter[str] = Counter()

    class Limited(H11Protocol):
        _address: str | None = None
        _waiting: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            address = self.client[0] if self.client else "?"
            counted = address not in exempt
            if len(self.connections) > total or (counted and open_from[address] >= per_address):
                transport.close()  # before any byte: the client sees the connection closed
                return
            if counted:
                self._address = address
                open_from[address] += 1
            self._wait_for_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            if self._address is not None:
                open_from[self._address] -= 1
                if not open_from[self._address]:
                    del open_from[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._stop_waiting()  # a request is being answered: its headers came

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._wait_for_headers()  # the next request of a kept-alive connection

        def shutdown(self) -> None:
            cycle = self.cycle
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                self.transport.close()  # as if the client hung up: its app hears it gone
            else:
                super().shutdown()

        def _wait_for_headers(self) -> None:
            self._stop_waiting()
            self._waiting = self.loop.call_later(headers_s, self._too_slow)

        def _stop_waiting(self) -> None:
            if self._waiting is not None:
                self._waiting.cancel()
                self._waiting = None

        def _too_slow(self) -> None:
            self._waiting = None
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()

    return Limited
