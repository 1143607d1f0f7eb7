"""The page's own events over plain HTTP, as its JavaScript sends them (or as an attacker with a
valid login would): log in, upload files, join Gradio's queue with an event's fn_index and any
data, read the result from the queue's event stream."""

from __future__ import annotations

import json
import secrets

import httpx

TIMEOUT_S = 60


def fn_index(config: dict, label: str, trigger: str) -> int:
    """The event (its fn_index) a component labelled (or showing, or with the elem_id) label
    runs on trigger, in the page's config (GET /config, or window.gradio_config)."""
    ids = {c["id"] for c in config["components"]
           if label in (c.get("props", {}).get(key) for key in ("label", "value", "elem_id"))}
    for dep in config["dependencies"]:
        if any(target[0] in ids and target[1] == trigger for target in dep["targets"]):
            return dep["id"]
    raise AssertionError(f"no {trigger} event on a component labelled {label!r}")


class PageSession:
    """One browser session of the page: its cookies, its session hash, the page's config."""

    def __init__(self, url: str, name: str | None = None, password: str | None = None):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=TIMEOUT_S)
        if name is not None:
            answer = self.http.post("login", data={"username": name, "password": password})
            assert answer.status_code == 200, answer.text
        self.config = self.http.get("config").json()
        self.session_hash = secrets.token_hex(6)

    def close(self) -> None:
        self.http.close()

    def fn_index(self, label: str, trigger: str) -> int:
        return fn_index(self.config, label, trigger)

    def upload(self, name: str, content: bytes) -> httpx.Response:
        return self.http.post("gradio_api/upload", files={"files": (name, content)})

    def run(self, fn_index: int, *data) -> tuple[bool, object]:
        """(True, the outputs) or (False, the error message shown); every message of the
        event's stream (updates, warnings, the end) is kept in self.seen."""
        self.seen: list[dict] = []
        joined = self.http.post("gradio_api/queue/join", json={
            "data": list(data), "fn_index": fn_index, "trigger_id": None,
            "event_data": None, "session_hash": self.session_hash})
        assert joined.status_code == 200, joined.text
        event_id = joined.json()["event_id"]
        with self.http.stream("GET", "gradio_api/queue/data",
                              params={"session_hash": self.session_hash}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") != event_id:
                    continue
                self.seen.append(message)
                if message.get("msg") == "process_completed":
                    output = message.get("output", {})
                    if message.get("success"):
                        return True, output.get("data")
                    return False, str(output.get("error"))
        raise AssertionError("the event stream ended before the event completed")


def file_data(path: str, name: str = "chats.json") -> dict:
    """A Gradio FileData naming path, as the page sends an uploaded file to an event."""
    return {"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}
