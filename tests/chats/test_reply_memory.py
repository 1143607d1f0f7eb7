"""A stateless conversation resent after a restart finds its whole KV file, its replies
included, even where a reply's tokens do not come back the same by re-tokenizing its text: the
exact tokens of the replies are kept beside the KV files (ReplyMemory's file)."""

from __future__ import annotations

import json

import pytest

from reame.chats.conversation import ReplyMemory
from reame.inference.kv.kvstore import REPLIES_NAME
from reame.inference.prompt import PromptBuilder, PromptMessage
from reame.inference.scope import NO_ACCOUNTS
from tests.conftest import SYSTEM_PROMPT
from tests.inference.test_cache import Node

# "lo" (a SmolLM2 token) forced at every step: the reply "lololo…" re-tokenizes otherwise.
LO_BIAS = 100.0


def lo_token(node: Node) -> int:
    (token,) = node.engine.tokenize("lo")
    return token


@pytest.mark.slow
def test_a_reply_that_does_not_retokenize_the_same_is_found_whole_after_a_restart(
        tmp_path, model_path):
    node = Node(tmp_path, model_path)
    question = [PromptMessage("user", "Say lo, again and again.")]
    lo = lo_token(node)
    first = node.finish(node.service.complete(
        SYSTEM_PROMPT, question, max_tokens=100, temperature=0.0, logit_bias=((lo, LO_BIAS),)))
    reply = first.text
    assert reply == "lo" * 100, reply
    # What makes this case: the reply's text is other tokens than the ones the model wrote.
    assert node.engine.tokenize(reply) != [lo] * 100
    node.kv.flush()
    asked = len(node.service.prompts.tokens(SYSTEM_PROMPT, question))

    # Beside it, lines that are not replies: a broken one, and one whose tokens are another
    # text than its own (as a damaged or forged file would hold): each is a miss, no more.
    path = node.kv.folder / REPLIES_NAME
    with path.open("a", encoding="utf-8") as out:
        out.write('["half a line\n')
        out.write(json.dumps([node.engine.fingerprint, NO_ACCOUNTS, "Forged.",
                              node.engine.tokenize(" Paris")]) + "\n")

    later = Node(tmp_path, model_path)  # a restart: nothing live, the replies' file read
    later.service.cache.index.build()
    turns = [*question, PromptMessage("assistant", reply), PromptMessage("user", "Thanks!")]
    last = later.finish(later.service.complete(SYSTEM_PROMPT, turns, max_tokens=4,
                                               temperature=0.0))
    assert last.stats.source == "prefix", last.stats
    # Past the question: into the reply (re-tokenized, the match would end where it begins).
    assert last.stats.reused > asked, (last.stats.reused, asked)

    # The forged line is not believed: "Forged." is its own tokens, not " Paris".
    known, prompt = later.service.replies.tokenize(
        later.service.prompts, SYSTEM_PROMPT,
        [*question, PromptMessage("assistant", "Forged."), PromptMessage("user", "Hm.")],
        NO_ACCOUNTS)
    assert known[1].tokens is None
    # Another user's (scope's) conversation with the same words is not given these tokens.
    other, _ = later.service.replies.tokenize(later.service.prompts, SYSTEM_PROMPT, turns,
                                              "user:someone-else")
    assert other[1].tokens is None


def test_the_replies_file_keeps_the_newest_and_stays_small(tmp_path, engine):
    """The file is rewritten with the replies kept once it holds twice as many lines; the
    memory read from it has the newest replies, in their order."""
    path = tmp_path / REPLIES_NAME
    memory = ReplyMemory(size=3, path=path)
    texts = [f"Reply number {n}." for n in range(10)]
    for text in texts:
        memory.remember(engine.fingerprint, NO_ACCOUNTS, text, engine.tokenize(" " + text))
        assert len(path.read_text().splitlines()) <= 2 * 3
    assert path.stat().st_mode & 0o777 == 0o600, "replies' words: Reame's alone, as KV files"
    again = ReplyMemory(size=3, path=path)
    prompts = PromptBuilder(engine)
    known, _ = again.tokenize(prompts, SYSTEM_PROMPT, [
        PromptMessage("user", "Hi."), *(PromptMessage("assistant", t) for t in texts)],
        NO_ACCOUNTS)
    remembered = [t.content for t in known[1:] if t.tokens is not None]
    assert remembered == texts[-3:]
    assert known[-1].tokens == tuple(engine.tokenize(" " + texts[-1]))
