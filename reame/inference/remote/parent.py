"""The engine in a process of its own: a crash of llama.cpp ends turns, not the server.

llama.cpp aborts the whole process on errors no Python code can catch (a grammar it cannot
parse, a failed assertion). RemoteRuntime is a ModelRuntime whose engine, KV cache and
scheduler run in a child process (remote/child.py) and are reached over a pipe; what the
server's side needs without asking (tokenizing, the chat template, the model's figures) it
has itself, from a vocabulary-only load of the same file. Turns cross as a Job and a Keeper:
the child runs the turn and asks this side's keeper to keep the reply; what the turn streams
comes back item by item, each when the caller asks for it (as Scheduler.results).

When the child dies, every call and stream under way ends with EngineCrashed (each turn's
reply kept as far as it was written while it streamed: chat_keeper.py), and died() says so
to whoever holds the runtime (ModelHolder replaces it with a new child).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection
from contextlib import contextmanager
from dataclasses import replace

import llama_cpp
from llama_cpp._internals import LlamaModel

from reame.config.refusals import RETRY_LOADING_S, ServerBusy
from reame.inference.prompt import PromptBuilder
from reame.inference.remote.snapshots import EngineFacts, packed, settle, unpacked
from reame.inference.scope import Scope
from reame.inference.tasks import Limits, Replaced, Stopped, Waiting
from reame.inference.turn import Job, Keeper, TurnObserver
from reame.inference.vocab import Vocabulary

log = logging.getLogger(__name__)


class EngineCrashed(ServerBusy):
    """The model's process ended in the middle of this: the reply stops here (what was shown
    is kept); the model is being loaded again (503, come back in a moment)."""

    def __init__(self, message: str = "the model's process ended unexpectedly: this reply "
                 "stopped where it was (what was shown is kept). The model is loaded again; "
                 "send again in a moment."):
        super().__init__(message, RETRY_LOADING_S)


class Place:
    """A place in the child's line (Scheduler.reserve's Task, by its number)."""

    def __init__(self, number: int):
        self.number = number
        self.done = threading.Event()  # its turn has ended (TurnStream.stop waits for it)
        self.turning = False  # a turn runs on it: done once the child says it ended


class RemoteRuntime:
    """A ModelRuntime (model_runtime.py) in another process: the same parts and verbs."""

    def __init__(self, build: Callable, args: tuple, limits: Limits):
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "reame.inference.remote.child", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], cwd=os.getcwd())
        theirs.close()
        self._conn = Connection(ours.detach())
        try:
            self._conn.send(("build", build, args))
            answer = self._conn.recv()
        except (EOFError, OSError):
            self.process.wait()
            raise EngineCrashed("the model's process ended while it loaded (exit code "
                                f"{self.process.returncode})") from None
        if answer[0] == "failed":
            self.process.wait()
            raise unpacked(answer[1])
        self.limits = limits
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._calls: dict[int, Future] = {}
        self._streams: dict[int, queue.SimpleQueue] = {}
        self._turns: dict[int, tuple[Keeper, Callable | None]] = {}
        self._places: dict[int, Place] = {}  # a turn's stream -> its place
        self._lock = threading.Lock()
        self._dead = threading.Event()
        self._retired = False
        self.observe: TurnObserver | None = None
        self.on_death: list[Callable[["RemoteRuntime"], None]] = []
        self.engine = RemoteEngine(self, answer[1])
        self._kv_folder = answer[2]
        self.prompts = PromptBuilder(self.engine)
        self.cache = Part(self, "cache")
        self.scheduler = RemoteScheduler(self)
        threading.Thread(target=self._read, name="reame-engine-pipe", daemon=True).start()

    # the pipe

    def _send(self, *message) -> None:
        if self._dead.is_set():
            raise EngineCrashed()
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                raise EngineCrashed() from None

    def call(self, part: str, name: str, *args, **kwargs):
        answer: Future = Future()
        rid = self._new(self._calls, answer)
        self._send("call", rid, part, name, args, kwargs)
        return answer.result()

    def stream(self, kind: str, *args, turn: tuple | None = None,
               place: Place | None = None) -> Iterator[object]:
        items: queue.SimpleQueue = queue.SimpleQueue()
        rid = self._new(self._streams, items)
        if turn is not None:
            self._turns[rid] = turn
        if place is not None:  # its end is known when the child says so, read or not
            self._places[rid] = place
        return self._items(rid, items, kind, args)

    def _items(self, rid: int, items: queue.SimpleQueue, kind: str, args: tuple):
        ended = False
        try:
            self._send("stream", rid, kind, args)
            while True:
                self._send("next", rid)
                kind_, value = items.get()
                if kind_ == "end":
                    ended = True
                    if value is not None:
                        raise value
                    return
                yield value
        finally:
            if not ended and not self._dead.is_set():
                try:
                    self._send("close", rid)
                    while items.get()[0] != "end":  # the turn winds down, keeping its reply
                        pass
                except EngineCrashed:
                    pass
            with self._lock:
                self._streams.pop(rid, None)
                self._turns.pop(rid, None)

    def _new(self, table: dict, value) -> int:
        with self._lock:
            rid = next(self._ids)
            table[rid] = value
        return rid

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind in ("ok", "err"):
                settle(self._calls, self._lock, message)
            elif kind in ("item", "end"):
                items = self._streams.get(message[1])
                value = message[2]
                if kind == "end" and value is not None:
                    value = unpacked(value)
                if kind == "end" and message[1] in self._places:
                    self._places.pop(message[1]).done.set()
                if items is not None:
                    items.put((kind, value))
            elif kind == "ask":
                threading.Thread(target=self._answer, args=message[1:], daemon=True).start()
            elif kind == "observe" and self.observe is not None:
                try:
                    self.observe(*message[1:])
                except Exception:
                    log.exception("the turn observer failed")
            elif kind == "bye":
                break
        self._died()

    def _answer(self, number: int, turn: int, name: str, args: tuple) -> None:
        keeper, seen = self._turns.get(turn, (None, None))
        try:
            if keeper is None:
                raise Stopped()
            if name == "alive":
                value = keeper.alive()
            elif name == "seen":
                value = seen() if seen is not None else None
            else:  # keep(decoding, stats): the stats as keeping left them, too
                decoding, stats = args
                value = keeper.keep(decoding, stats), stats
            self._send("ok", number, value)
        except BaseException as exc:
            try:
                self._send("err", number, packed(exc))
            except EngineCrashed:
                pass

    def _died(self) -> None:
        """The child is gone: everything under way ends with EngineCrashed."""
        self._dead.set()
        with self._lock:
            calls, streams = list(self._calls.values()), list(self._streams.values())
            self._calls.clear()
        for answer in calls:
            answer.set_exception(EngineCrashed())
        for items in streams:
            items.put(("end", EngineCrashed()))
        for place in list(self._places.values()):
            place.done.set()
        if not self._retired:
            try:
                code = self.process.wait(5)
            except subprocess.TimeoutExpired:
                code = None
            log.error("the model's process ended (exit code %s)", code)
            for tell in self.on_death:
                tell(self)

    @property
    def alive(self) -> bool:
        return not self._dead.is_set()

    @property
    def retired_for_good(self) -> bool:
        """Its process has ended: it cannot serve again (ModelHolder does not reopen it)."""
        return self._dead.is_set()

    @property
    def kv_folder(self):
        return self._kv_folder

    def warm(self, system_prompt: str) -> None:
        self.call("runtime", "warm", system_prompt)

    # ModelRuntime's face

    @property
    def retired(self) -> bool:
        return self._retired or self._dead.is_set()

    @contextmanager
    def lease(self) -> Iterator["RemoteRuntime"]:
        if self.retired:
            raise Replaced()
        yield self  # the engine's side never closes under a caller of this side

    def retire(self) -> None:
        self._retired = True
        if self.alive:
            try:
                self.call("scheduler", "stop", cancel=True, error=Replaced)
                self.call("cache", "flush")
            except EngineCrashed:
                pass

    def reopened(self) -> "RemoteRuntime":
        self._retired = False
        return self

    def close(self) -> None:
        self._retired = True
        if self.alive:
            try:
                self._send("exit")
            except EngineCrashed:
                pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def run_turn(self, place: Place, job: Job, keeper: Keeper,
                 observe: TurnObserver | None = None) -> Iterator[object]:
        self.observe = observe or self.observe
        place.turning = True
        items = self.stream("turn", place.number, replace(job, seen=None if job.seen is None
                                                          else True),
                            observe is not None, turn=(keeper, job.seen), place=place)

        def results() -> Iterator[object]:
            try:
                yield from items
            finally:
                items.close()
                place.done.set()
        return results()

    def type_ahead(self, job: Job) -> int:
        return self.call("runtime", "type_ahead", job)

    def write_aside(self, job: Job) -> str | None:
        return self.call("runtime", "write_aside", job)

    def restore_ahead(self, chat_id: int, scope: Scope) -> bool:
        return self.call("runtime", "restore_ahead", chat_id, scope)

    def restore_ahead_prelude(self, chat_id: int, scope: Scope):
        return ("restore", chat_id, scope)  # RemoteScheduler.reserve passes it on

    def share(self, opening: list[int], scope: Scope) -> bool:
        return self.call("runtime", "share", opening, scope)


class Part:
    """One part of the child's runtime (its KV cache): every attribute asked for there."""

    def __init__(self, runtime: RemoteRuntime, part: str):
        self._runtime, self._part = runtime, part

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in ("enabled", "prefill_rate"):  # attributes, not methods
            return self._runtime.call(self._part, name)
        return lambda *args, **kwargs: self._runtime.call(self._part, name, *args, **kwargs)


class RemoteScheduler:
    def __init__(self, runtime: RemoteRuntime):
        self._runtime = runtime

    @property
    def max_waiting(self) -> int:
        return self._runtime.limits.max_waiting

    def reserve(self, *, prelude=None, **where) -> Place:
        if prelude is not None:
            where["restore_ahead"] = prelude[1:]
        return Place(self._runtime.call("scheduler", "reserve", **where))

    def wait_for_slot(self, place: Place) -> Iterator[Waiting]:
        return self._runtime.stream("wait", place.number)

    def cancel(self, place: Place) -> None:
        try:
            self._runtime.call("scheduler", "cancel", place.number)
        except EngineCrashed:
            place.done.set()
            return
        if not place.turning:  # nothing ran on it: it is over now
            place.done.set()

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name == "busy":
            return self._runtime.call("scheduler", "busy")
        return lambda *args, **kwargs: self._runtime.call("scheduler", name, *args, **kwargs)


class RemoteEngine(Vocabulary):
    """The engine's facts as it loaded, and its vocabulary (a vocabulary-only load of the same
    file, in this process): what the server's side reads without asking."""

    def __init__(self, runtime: RemoteRuntime, facts: EngineFacts):
        self._runtime = runtime
        self.__dict__.update(facts.values)
        self.sequences = [None] * facts.slots  # their number: the slots
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = LlamaModel(path_model=str(self.model_path), params=params, verbose=False)
        self._vocab = self._model.vocab

    @property
    def name(self) -> str:
        return self.model_path.name

    def check_grammar(self, grammar: str, trigger: str | None = None) -> None:
        """Engine.check_grammar, in the engine's process: llama.cpp parses the grammar there."""
        self._runtime.call("engine", "check_grammar", grammar, trigger)

    def set_threads(self, threads: int | None = None) -> None:
        self._runtime.call("engine", "set_threads", threads)

    def close(self) -> None:
        self._runtime.close()

