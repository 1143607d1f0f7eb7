"""The engine's own process: a ModelRuntime (engine, KV cache, scheduler) driven over a pipe
by a RemoteRuntime in the server's process (remote/parent.py says why and how).

Messages are tuples, pickled by multiprocessing's Connection. From the parent:

- ("call", rid, part, name, args, kwargs): part.name(*args, **kwargs) on a thread of its own,
  part one of "runtime", "engine", "cache", "scheduler"; answered ("ok", rid, value) or
  ("err", rid, exception). A Task (Scheduler.reserve) crosses as its number (a place).
- ("stream", rid, kind, args): a generator ("turn": run_turn; "wait": wait_for_slot) run on a
  thread of its own, one item per ("next", rid), as ("item", rid, item); its end as
  ("end", rid, exception or None); ("close", rid) closes it (then "end" all the same).
- ("ok" | "err", rid, ...): the answer to one of the child's own questions (a Keeper's alive
  and keep, a Job's seen), asked as ("ask", rid, turn, name, args).
- ("exit",): write the KV files and end.

Exceptions cross packed (snapshots.packed): their class, args and attributes.

To the parent besides: ("ready", facts) once the model is loaded, ("observe", stats,
decoding, stored) for every turn's end (the metrics).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import sys
import threading
from concurrent.futures import Future
from dataclasses import replace
from multiprocessing.connection import Connection

from reame.inference.model_runtime import ModelRuntime
from reame.inference.remote.snapshots import DecodingSnapshot, facts_of, packed, settle

log = logging.getLogger(__name__)

STOP_WAIT_S = 30.0  # a cancelled place's task ends within one decode; this bounds the wait


def main(fd: int) -> None:
    """`python -m reame.inference.remote.child FD`: the pipe is the socket FD; its first message
    ("build", build, args) says how to load: build(*args) a ModelRuntime; say so, serve until
    told to end or until the parent is gone."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    conn = Connection(fd)
    _, build, args = conn.recv()
    try:
        runtime = build(*args)
    except BaseException as exc:  # the parent says why no model loaded
        conn.send(("failed", packed(exc)))
        return
    conn.send(("ready", facts_of(runtime.engine), runtime.kv_folder))
    Child(conn, runtime).serve()


class Child:
    def __init__(self, conn, runtime: ModelRuntime):
        self.conn, self.runtime = conn, runtime
        self._send_lock = threading.Lock()
        self._places: dict[int, object] = {}  # place number -> Task
        self._turning: set[int] = set()  # places a turn runs on
        self._place_ids = itertools.count(1)
        self._streams: dict[int, queue.SimpleQueue] = {}
        self._asked: dict[int, Future] = {}
        self._ask_ids = itertools.count(1)
        self._lock = threading.Lock()

    def send(self, *message) -> None:
        with self._send_lock:
            self.conn.send(message)

    def serve(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the parent is gone: nothing to answer anymore
                os._exit(0)
            kind = message[0]
            if kind == "call":
                threading.Thread(target=self._call, args=message[1:], daemon=True).start()
            elif kind == "stream":
                rid = message[1]
                commands = self._streams[rid] = queue.SimpleQueue()
                threading.Thread(target=self._stream, args=(*message[1:], commands),
                                 daemon=True).start()
            elif kind in ("next", "close"):
                commands = self._streams.get(message[1])
                if commands is not None:
                    commands.put(kind)
            elif kind in ("ok", "err"):
                settle(self._asked, self._lock, message)
            elif kind == "exit":
                self.runtime.retire()
                self.send("bye")
                return

    # the parent's questions

    def _call(self, rid: int, part: str, name: str, args: tuple, kwargs: dict) -> None:
        try:
            value = self._do(part, name, args, kwargs)
        except BaseException as exc:
            self.send("err", rid, packed(exc))
            return
        try:
            self.send("ok", rid, value)
        except Exception as exc:  # an answer that cannot cross: the caller is told, not left
            self.send("err", rid, packed(TypeError(
                f"{part}.{name}'s answer cannot cross to the server's process: {exc}")))

    def _do(self, part: str, name: str, args: tuple, kwargs: dict):
        runtime = self.runtime
        if part == "scheduler" and name == "reserve":
            prelude = kwargs.pop("restore_ahead", None)
            if prelude is not None:  # (chat_id, scope): the turn's slot restores its file
                kwargs["prelude"] = runtime.restore_ahead_prelude(*prelude)
            task = runtime.scheduler.reserve(**kwargs)
            number = next(self._place_ids)
            self._places[number] = task
            return number
        if part == "scheduler" and name == "cancel":  # the place stays until its turn ends
            task = self._places.get(args[0])
            if task is not None:
                runtime.scheduler.cancel(task)
                if args[0] not in self._turning:  # answered once it has ended, as Task.done
                    task.done.wait(STOP_WAIT_S)
                    self._places.pop(args[0], None)
            return None
        target = {"runtime": runtime, "engine": runtime.engine, "cache": runtime.cache,
                  "scheduler": runtime.scheduler}[part]
        value = getattr(target, name)
        return value(*args, **kwargs) if callable(value) else value

    def _stream(self, rid: int, kind: str, args: tuple, commands: queue.SimpleQueue) -> None:
        steps = None
        try:
            steps = self._open(rid, kind, args)
            while commands.get() == "next":
                try:
                    item = next(steps)
                except StopIteration:
                    break
                self.send("item", rid, item)
            else:
                steps.close()  # the caller went away: the turn winds down, keeping its reply
        except BaseException as exc:
            self.send("end", rid, packed(exc))
        else:
            self.send("end", rid, None)
        finally:
            self._streams.pop(rid, None)
            if kind == "turn":
                self._places.pop(args[0], None)
                self._turning.discard(args[0])

    def _open(self, rid: int, kind: str, args: tuple):
        runtime = self.runtime
        if kind == "wait":
            return runtime.scheduler.wait_for_slot(self._places[args[0]])
        place, job, observe = args
        task = self._places[place]
        self._turning.add(place)
        keeper = AskingKeeper(self, rid)
        job = replace(job, seen=keeper.seen if job.seen is not None else None)
        return runtime.run_turn(task, job, keeper, self._observe if observe else None)

    def _observe(self, stats, decoding, stored: bool) -> None:
        self.send("observe", stats, DecodingSnapshot.of(decoding) if decoding else None, stored)

    # the child's own questions

    def ask(self, turn: int, name: str, *args):
        answer: Future = Future()
        with self._lock:
            number = next(self._ask_ids)
            self._asked[number] = answer
        self.send("ask", number, turn, name, args)
        return answer.result()


class AskingKeeper:
    """A turn's Keeper in the parent, asked over the pipe (turn.Keeper): alive, keep; and its
    Job's seen."""

    def __init__(self, child: Child, turn: int):
        self.child, self.turn = child, turn

    def alive(self) -> bool:
        return self.child.ask(self.turn, "alive")

    def keep(self, decoding, stats) -> int | None:
        message_id, kept_stats = self.child.ask(self.turn, "keep", DecodingSnapshot.of(decoding),
                                                stats)
        stats.__dict__.update(kept_stats.__dict__)  # what keeping wrote into them
        return message_id

    def seen(self) -> float | None:
        return self.child.ask(self.turn, "seen")


if __name__ == "__main__":
    main(int(sys.argv[1]))
