"""gradio_client's Client for the tests, without its race between one call and the next.

With Gradio's sse_v3 protocol one event stream per client carries every call's messages, and the
server closes it as soon as the client has no call left. gradio_client 2.7.2 opens a new stream
for a call only when it believes none is open: a call made right after another one finished, while
the old stream's close is still on its way, is tagged to that stream and is cancelled when it
closes (`concurrent.futures.CancelledError` from `stream_sse_v1plus`). It is rare on an idle
machine and was seen once in a CI run of the whole suite on a loaded one.

ApiClient waits, before each call, for a stream that is closing (open with no call pending) to
be closed; bounded, so that a stream the server keeps open costs at most the bound.
"""

import time

from gradio_client import Client

CLOSING_BOUND_S = 10.0


class ApiClient(Client):
    def submit(self, *args, **kwargs):
        self._wait_for_a_closing_stream()
        return super().submit(*args, **kwargs)

    def _wait_for_a_closing_stream(self) -> None:
        deadline = time.monotonic() + CLOSING_BOUND_S
        while time.monotonic() < deadline:
            with self.pending_lock:
                closing = self.stream_open and not self.pending_event_ids
            if not closing:
                return
            time.sleep(0.005)
