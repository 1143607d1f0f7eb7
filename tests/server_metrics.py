"""A running server's /metrics, read the way a scraper would: one sample, and waiting until
no turn holds a slot (a turn whose client went away ends at its next step, a moment later)."""

from __future__ import annotations

import http.client
import time

from prometheus_client.parser import text_string_to_metric_families

from .conftest import Server


def metric(server: Server, name: str, **labels: str) -> float:
    """A sample of /metrics, summed over the samples that match labels (0 for a labelled
    counter not counted yet)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    found = [sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples
             if sample.name == name and all(sample.labels.get(k) == v
                                            for k, v in labels.items())]
    if not found and not labels:
        raise AssertionError(f"{name} not in /metrics")
    return sum(found)


def settle(server: Server, timeout: float = 30.0) -> None:
    """Wait until no turn is active (an abandoned one has ended, a finished one has written
    its KV and let its slot go), at most timeout seconds."""
    deadline = time.monotonic() + timeout
    while metric(server, "reame_turns_active") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert metric(server, "reame_turns_active") == 0
