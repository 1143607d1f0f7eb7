"""With [cache] exact, the cache changes the speed, never the answer: the same request gives
the same reply, bit for bit, whatever part of its prompt was computed now, was live, came from
a file after a restart, or came from another conversation sharing its opening. In either mode
(the default reuses every shared token) a continued conversation gives the uninterrupted one's
reply, and the same request sent again the same reply.

llama.cpp's kernels round differently for different decode shapes, and only some CPUs show it
on a given model: on the AVX-512 machine these tests were written on, SmolLM2's kernels give
the same bits for any split while Gemma 3's Q4_K kernels do not (logits differ by up to 0.9).
So each case is checked twice: by the decodes that made the prompt's KV (the same on every
CPU: batches.plan), and by the first token's logits (xxh3 of their bytes) and the reply's
words, on both models.
"""

from __future__ import annotations

import shutil

import pytest

from reame.config.reame_conf import GenerationConfig
from reame.inference.batches import plan
from reame.inference.engine import Engine
from reame.inference.prompt import PromptMessage
from reame.runtime import service_over

from tests.conftest import FULL, THREADS

OPENING = ("You answer questions for the visitors of a small natural history museum. Keep "
           "each answer short and friendly, name the hall where the answer can be seen, and "
           "never invent exhibits. The halls are: minerals, fossils, birds, insects, oceans, "
           "and the night sky. ") * 2
QUESTIONS = [
    "Where are the dinosaur bones?",
    "Do you have any meteorites?",
    "What is the biggest bird you show?",
    "Can children touch the crystals?",
    "Is there a whale skeleton?",
    "Where can I see butterflies?",
    "Which hall has the telescope?",
    "Are there live insects?",
    "How old is the oldest fossil here?",
    "Do you show any sharks?",
    "Where are the gemstones from?",
    "What is in the oceans hall?",
    "Can I see the moon through a telescope today?",
    "Which fossils come from this region?",
    "Do you have an owl?",
    "Where is the amber with insects inside?",
    "Is there a planetarium show?",
    "What do the minerals glow like under ultraviolet light?",
    "Which bird can fly the highest?",
    "Do you have coral from the reef?",
    "Where can I see a giant squid?",
    "What is the rarest mineral in the collection?",
]
# Different lengths: some questions carry a longer preamble.
PROMPTS = [("I am visiting with my family this afternoon. " * (i % 4)) + q
           for i, q in enumerate(QUESTIONS)]
MAX_TOKENS = 8
SAMPLINGS = {"greedy": dict(temperature=0.0, top_p=1.0, seed=None),
             "seeded": dict(temperature=0.8, top_p=0.95, seed=1234)}
DEFAULTS = GenerationConfig(system_prompt=OPENING, temperature=0.0, top_p=1.0,
                            max_tokens=MAX_TOKENS)


class Node:
    """One server 'process' over a folder: engine, SQLite, KV files, service."""

    def __init__(self, folder, model_path, *, cache=True, exact=False):
        self.engine = Engine(model_path, n_ctx=2048, n_threads=THREADS, exact_reuse=exact)
        self.service = service_over(folder, self.engine, DEFAULTS, cache=cache)

    def ask(self, question: str, sampling: str, history: tuple = ()):
        """A stateless request (the /v1 path): the reply, the first token's logits digest,
        and where its prompt's KV came from."""
        turns = [*history, PromptMessage("user", question)]
        last = list(self.service.complete(OPENING, turns, max_tokens=MAX_TOKENS,
                                          **SAMPLINGS[sampling]))[-1]
        if not history:  # a history with kept replies is not evaluated as a cold start is
            self.check_plan(turns)
        return last.text, last.stats.first_logits, last.stats.source

    def check_plan(self, turns):
        """The prompt's KV was made by exactly the decodes a cold start makes: the reused part
        by whoever computed it, the rest now (checked on every CPU)."""
        prompt = self.service.prompts.tokens(OPENING, turns)
        made = [(b.start, b.end) for b in self.engine.batches if b.end <= len(prompt)]
        assert made == plan(0, len(prompt)), "the prompt was evaluated in other decodes"

    def close(self):
        self.service.cache.flush()
        self.engine.close()


MODELS = ["smollm2", "gemma3", "qwen35"]  # qwen35: the tiny hybrid (tests/tiny_models.py)
# (model, sampling) pairs. make test leaves out Gemma 3 seeded (13 s of the suite's 2-worker
# time): the seeded sampler's path is the same code on either model, and SmolLM2-seeded takes
# it; what is Gemma's own, its kernels' rounding over the decode shapes, Gemma-greedy checks.
# make test-full (FULL) keeps all four.
CASES = [(m, s) for m in MODELS for s in SAMPLINGS if FULL or (m, s) != ("gemma3", "seeded")]


@pytest.fixture
def model(request):
    return request.getfixturevalue({"smollm2": "model_path", "gemma3": "gemma_path",
                                    "qwen35": "qwen35_path"}[request.param])


# Under make test-full, 47 s alone on this 2-core machine, 157 s inside the whole suite
# (2026-12-03): more than the default 300 s would leave no margin on a slower CPU.
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("model", "sampling"), CASES, indirect=["model"])
def test_the_same_request_gives_the_same_reply_whatever_the_cache_holds(
        tmp_path, model, sampling):
    # Greedy replies flip at near ties, so many prompts are tried, each one way: greedily
    # blocks 0-3, 8-11, 16-19, seeded (the sampler's own path) the others. Each set holds every
    # preamble length (i % 4). Half each keeps the test within its time on a slow CPU (all 22
    # greedily took over 5 minutes on a loaded 2-core runner).
    greedy = sampling == "greedy"
    prompts = [p for i, p in enumerate(PROMPTS) if (i // 4) % 2 == (0 if greedy else 1)]
    if not FULL:  # make test: each preamble length once per model, greedily lengths 0 and
        prompts = prompts[0:4:2] if greedy else prompts[1:4:2]  # 2, seeded 1 and 3 (full: all)
    # Cold: nothing live, no cache, each prompt from position 0.
    cold_node = Node(tmp_path / "cold", model, cache=False, exact=True)
    cold = {}
    for prompt in prompts:
        cold_node.engine.clear()
        cold[prompt] = cold_node.ask(prompt, sampling)[:2]
        # Again with the cache off: the live KV is reused, the reply is the same.
        text, logits, source = cold_node.ask(prompt, sampling)
        assert source == "live" and (text, logits) == cold[prompt], prompt
        assert cold_node.service.cache.stats()["hits"] == 0
    cold_node.close()

    # One server: each prompt first shares the long opening with the ones before it (a
    # shared prefix, from the live KV or another conversation's file), then comes again
    # with its own KV live.
    folder = tmp_path / "served"
    node = Node(folder, model, exact=True)
    sources = set()
    for n, prompt in enumerate(prompts):
        text, logits, source = node.ask(prompt, sampling)
        if n:
            sources.add(source)
            assert source != "none", "the long opening was not reused"
        assert (text, logits) == cold[prompt], f"shared opening changed the reply: {prompt!r}"
        text, logits, source = node.ask(prompt, sampling)
        assert source in ("live", "prefix")
        assert (text, logits) == cold[prompt], f"live KV changed the reply: {prompt!r}"
    node.close()

    # A restart: every prompt again, its KV read from the file its first answer wrote.
    node = Node(folder, model, exact=True)
    for prompt in prompts:
        node.engine.clear()  # nothing live: the prompt's KV comes from a file
        text, logits, source = node.ask(prompt, sampling)
        assert source == "prefix", f"no file was restored for {prompt!r}"
        assert (text, logits) == cold[prompt], f"restored KV changed the reply: {prompt!r}"
    node.close()


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS, indirect=True)
def test_a_continued_conversation_gives_the_uninterrupted_reply(
        tmp_path, model):
    """A conversation whose KV was kept (replies as the exact tokens generated): a stateless
    continuation gives the same reply again; a stored chat's turn gives the same reply live,
    from its file after a restart, regenerated, and with its message typed ahead."""
    folder = tmp_path / "served"
    node = Node(folder, model)
    service = node.service
    first = list(service.complete(OPENING, [PromptMessage("user", PROMPTS[0])],
                                  max_tokens=MAX_TOKENS, temperature=0.0))[-1]
    history = (PromptMessage("user", PROMPTS[0]), PromptMessage("assistant", first.text))
    live = node.ask(PROMPTS[1], "greedy", history)
    # The same request again: from the KV its first answer left, the same reply. (After a
    # restart the server no longer knows the reply's text as the tokens it generated, and a
    # re-tokenized reply is another prompt: docs/cache.md, "Same request, same reply".)
    again = node.ask(PROMPTS[1], "greedy", history)
    assert again[2] == "live" and again[:2] == live[:2]
    node.close()

    # A stored chat: live, then from its file after a restart, then regenerated.
    node = Node(tmp_path / "chats", model)
    chat = node.service.new_chat()
    list(node.service.send(chat.id, PROMPTS[2]))
    said = list(node.service.send(chat.id, PROMPTS[3]))[-1]
    node.close()
    node = Node(tmp_path / "chats", model)
    redo = list(node.service.regenerate(chat.id))[-1]
    assert redo.stats.source == "disk"
    assert (redo.text, redo.stats.first_logits) == (said.text, said.stats.first_logits)
    redo = list(node.service.regenerate(chat.id))[-1]
    assert redo.stats.source == "live"
    assert (redo.text, redo.stats.first_logits) == (said.text, said.stats.first_logits)
    node.close()

    # The same turn with its message typed ahead first (a copy of the folder: a twin server).
    shutil.copytree(tmp_path / "chats", tmp_path / "twin")
    # Exact: typed ahead, the prompt's last decodes are those of an untyped send ([cache]
    # exact off reuses the draft's tokens wherever it was cut).
    plain = Node(tmp_path / "chats", model, exact=True)
    typed = Node(tmp_path / "twin", model, exact=True)
    # Long enough to cross a chunk boundary where the prompt is evaluated in whole CHUNKs
    # (Gemma 3's template renders a reply otherwise than it was generated: no kept KV).
    message = (PROMPTS[4] + " We would like to know what to expect before we go, because my "
               "two children love animals and old bones, and they will ask me many questions. We "
               "will arrive by bus at about two o'clock and stay until the museum closes. "
               "Please answer in one short sentence, without any list.")
    evaluated = 0
    # A draft every 6 characters under make test-full; every 24 in make test (about 18 drafts
    # of this message instead of 70: each re-evaluates the draft's last chunk).
    for end in range(6, len(message), 6 if FULL else 24):
        evaluated += typed.service.type_ahead(chat.id, message[:end])
    assert evaluated > 0, "nothing was evaluated while typing"
    sent = list(plain.service.send(chat.id, message))[-1]
    typed_sent = list(typed.service.send(chat.id, message))[-1]
    assert typed_sent.stats.typed_ahead > 0
    assert (typed_sent.text, typed_sent.stats.first_logits) == (
        sent.text, sent.stats.first_logits)
    plain.close()
    typed.close()
