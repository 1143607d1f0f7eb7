"""Synthetic chat content from a fixed seed: filler messages, histories of a token length, scripts.

Nothing here talks to a model except through a `count` function (text -> number of tokens),
so every system gets exactly the same words.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

SEED = 20250101
# Tokens the chat template adds around one message (role header, end marker, newlines).
TEMPLATE_TOKENS = 5

_WORDS = (
    "the a library book shelf reader river city garden morning evening window table letter "
    "journey mountain winter summer station train ticket coffee kitchen recipe bread market "
    "question answer idea story chapter history museum painting music song teacher student "
    "lesson school bridge harbor ship island forest path stone lamp candle clock street "
    "neighbor friend family holiday weather rain cloud sun light shadow color map road "
    "village farmer field harvest apple orange basket wooden old new quiet bright small large "
    "careful simple quick slow warm cold early late gentle curious patient honest busy "
    "walks reads writes finds keeps opens closes carries builds paints sings remembers "
    "explains asks answers notices prepares visits returns follows learns teaches shares "
    "and but because while after before when although since so then also often always "
    "never sometimes usually every each many few several some most other another"
).split()

_TOPICS = (
    "how tides work", "a recipe for lentil soup", "the history of printing", "why leaves change "
    "colour", "how to plan a vegetable garden", "the rules of chess openings", "what makes bread "
    "rise", "how bicycles stay upright", "the life of honey bees", "how to read a train "
    "timetable", "why the sky is blue", "the basics of budgeting", "how glaciers move",
    "the story of the lighthouse keepers", "how to care for a houseplant", "what a compiler does",
)


def sentence(rng: random.Random, low: int = 8, high: int = 16) -> str:
    """One sentence of filler words, capitalised, with a full stop."""
    words = [rng.choice(_WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def paragraph(rng: random.Random, n_words: int) -> str:
    """Sentences of filler adding up to about n_words words."""
    out, total = [], 0
    while total < n_words:
        s = sentence(rng)
        out.append(s)
        total += s.count(" ") + 1
    return " ".join(out)


def user_message(rng: random.Random, n_words: int = 40) -> str:
    """A user's message: a question on a topic followed by filler."""
    return f"Tell me about {rng.choice(_TOPICS)}. {paragraph(rng, n_words)}"


@dataclass(frozen=True)
class History:
    """User/assistant message pairs whose rendered length is about `tokens`."""

    pairs: list[tuple[str, str]]
    tokens: int  # the estimated tokens of the pairs, template included


def history(count: Callable[[str], int], target: int, *, seed: int = SEED,
            user_words: int = 40, reply_words: int = 80) -> History:
    """Pairs of filler messages until the history holds about target tokens (never above)."""
    rng = random.Random(f"{seed}-{target}")
    pairs: list[tuple[str, str]] = []
    total = 0
    while True:
        user, reply = user_message(rng, user_words), paragraph(rng, reply_words)
        cost = count(user) + count(reply) + 2 * TEMPLATE_TOKENS
        if total + cost > target:
            user = user_message(rng, 8)  # a short last pair fills the rest
            room = target - total - 2 * TEMPLATE_TOKENS - count(user)
            if room > 8:
                reply = _fit(count, rng, room)
                pairs.append((user, reply))
                total += count(user) + count(reply) + 2 * TEMPLATE_TOKENS
            return History(pairs, total)
        pairs.append((user, reply))
        total += cost


def _fit(count: Callable[[str], int], rng: random.Random, tokens: int) -> str:
    """Filler text of at most `tokens` tokens (at least one word), as long as fits."""
    words = paragraph(rng, tokens).split()
    low, high = 1, len(words)  # the longest prefix of words that fits: binary search
    while low < high:
        mid = (low + high + 1) // 2
        if count(" ".join(words[:mid])) <= tokens:
            low = mid
        else:
            high = mid - 1
    return " ".join(words[:low])


def system_prompt(count: Callable[[str], int], tokens: int, *, seed: int = SEED) -> str:
    """A long system prompt of about `tokens` tokens: instructions plus filler."""
    rng = random.Random(f"{seed}-system-{tokens}")
    head = "You are a meticulous assistant for a public library. Follow these house notes. "
    return head + _fit(count, rng, max(8, tokens - count(head)))


def unrelated_prompts(n: int, n_words: int, *, seed: int = SEED) -> list[str]:
    """n single-turn prompts on different topics, sharing nothing but the template."""
    rng = random.Random(f"{seed}-unrelated")
    return [f"Question {i + 1}: explain {_TOPICS[i % len(_TOPICS)]}. {paragraph(rng, n_words)}"
            for i in range(n)]


@dataclass(frozen=True)
class Step:
    """One turn of a scripted day: which chat, what the user says, and whether the server
    restarts just before it."""

    chat: int  # index into the day's chats
    text: str
    restart_before: bool = False


def day_script(n_turns: int, n_chats: int, restart_every: int, *, seed: int = SEED,
               stay: float = 0.5, words: int = 30) -> list[Step]:
    """Turns across chats: half the time the user stays in the same chat, else switches."""
    rng = random.Random(f"{seed}-day")
    steps, current = [], 0
    for turn in range(n_turns):
        if turn and rng.random() >= stay:
            current = rng.choice([c for c in range(n_chats) if c != current])
        restart = bool(turn) and turn % restart_every == 0
        steps.append(Step(current, user_message(rng, words), restart))
    return steps


def long_chat_messages(n: int, words: tuple[int, int] = (48, 75), *,
                       seed: int = SEED) -> list[str]:
    """n user messages for one long chat: a paragraph of words[0] to words[1] words each (about
    60 to 100 tokens with SmolLM2's tokenizer)."""
    rng = random.Random(f"{seed}-long-chat")
    low, high = words
    return [f"Turn {i + 1}. {paragraph(rng, rng.randint(low, high))}" for i in range(n)]
