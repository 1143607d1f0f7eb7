"""Stateless turns (the OpenAI routes): a whole conversation (/v1/chat/completions) or a text
(/v1/completions) answered with nothing stored but the KV, found again by the prompt's tokens
(a mixin of ChatService beside Turns, whose runner and updates it shares)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from reame.chats.conversation import (
    STATELESS_TEMPERATURE,
    STATELESS_TOP_P,
    ConversationKeeper,
    PlainKeeper,
)
from reame.config.refusals import ChatError, EmptyMessage, MessageTooLong, NoModel, check_seed
from reame.inference.model_runtime import ModelRuntime
from reame.inference.prompt import PromptMessage
from reame.inference.sampling import Sampling
from reame.inference.scope import Scope, user_scope
from reame.inference.tasks import Replaced
from reame.inference.tools import Tool, repeated_call
from reame.inference.turn import Job, Keeper, TurnUpdate
from reame.inference.turn_stream import TurnStream


class StatelessTurns:
    """ChatService's stateless turns (a mixin: the state is ChatService.__init__'s; _updates
    and _check_length are Turns')."""

    def complete(self, system_prompt: str, turns: list[PromptMessage], *,
                 max_tokens: int | None = None,
                 temperature: float = STATELESS_TEMPERATURE, top_p: float = STATELESS_TOP_P,
                 top_k: int | None = None, seed: int | None = None, stop: tuple[str, ...] = (),
                 logit_bias: tuple[tuple[int, float], ...] = (),
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 top_logprobs: int | None = None, grammar: str | None = None,
                 grammar_trigger: str | None = None, tools: tuple[Tool, ...] = (),
                 user: str | None = None) -> TurnStream:
        """Answer a whole conversation sent at once. Its KV is found by its tokens (the
        cache's block-hash index, within user's scope), so a conversation resent with one
        more message evaluates only that message. Refusals (no model, too long) raise before
        the first update. tools: the functions the reply may call (tools.py); the grammar
        (GBNF) holds the reply, from where grammar_trigger matches when given."""
        if self.runtime is None:
            raise NoModel(self.load_error or "no model is loaded")
        check_seed(seed)
        self._check_length(system_prompt, *(t.content for t in turns))
        self._check_vocabulary("logit_bias", [token for token, _ in logit_bias])
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed,
                            logit_bias=logit_bias, frequency_penalty=frequency_penalty,
                            presence_penalty=presence_penalty, top_logprobs=top_logprobs,
                            grammar=grammar, grammar_trigger=grammar_trigger,
                            **({} if top_k is None else {"top_k": top_k}))
        scope = user_scope(user)

        def job(runtime: ModelRuntime) -> tuple[Job, ConversationKeeper]:
            prompts = runtime.prompts  # tokenized with the model that answers
            known, prompt = self.replies.tokenize(prompts, system_prompt, turns, scope, tools)
            return (Job(prompt, known, system_prompt, scope, sampling,
                        max_tokens or self.defaults.max_tokens, stop, tools=tools,
                        ends=repeated_call if tools else None,
                        # with tools the opening is this request's, not the administrator's
                        shared_opening=(system_prompt == self.defaults.system_prompt
                                        and not tools)),
                    ConversationKeeper(self.replies, runtime.engine.fingerprint, scope))

        return TurnStream(lambda stream: self._stateless(stream, job, scope, user))

    def complete_text(self, prompt: str | list[int], *, max_tokens: int,
                      temperature: float = STATELESS_TEMPERATURE,
                      top_p: float = STATELESS_TOP_P, seed: int | None = None,
                      stop: tuple[str, ...] = (),
                      logit_bias: tuple[tuple[int, float], ...] = (),
                      frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                      top_logprobs: int | None = None,
                      user: str | None = None) -> TurnStream:
        """Continue a text (/v1/completions): raw text, no chat template, tokenized with its
        control tokens parsed (a completion client writes its own template) and a BOS where
        the model wants one; or the model's token ids as they are. Nothing is stored but the
        KV, found again by the tokens as a conversation's is: a client that resends its text
        grown by the reply and more evaluates only what is new. Refusals (no model, empty,
        too long, a token not in the vocabulary) raise before the first update."""
        if self.runtime is None:
            raise NoModel(self.load_error or "no model is loaded")
        check_seed(seed)
        if isinstance(prompt, str):
            self._check_length(prompt)
        self._check_vocabulary("logit_bias", [token for token, _ in logit_bias])
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed,
                            logit_bias=logit_bias, frequency_penalty=frequency_penalty,
                            presence_penalty=presence_penalty, top_logprobs=top_logprobs)
        scope = user_scope(user)

        def job(runtime: ModelRuntime) -> tuple[Job, PlainKeeper]:
            tokens = text_tokens(runtime, prompt)
            return (Job(tokens, [], "", scope, sampling, max_tokens, stop, plain=True),
                    PlainKeeper())

        return TurnStream(lambda stream: self._stateless(stream, job, scope, user))

    def _check_vocabulary(self, param: str, tokens: list[int]) -> None:
        if not tokens:
            return
        with self.using_model() as runtime:
            n_vocab = runtime.engine.n_vocab
        for token in tokens:
            if not 0 <= token < n_vocab:
                raise ChatError(f"{param}: token {token} is not in the model's vocabulary "
                                f"(0 to {n_vocab - 1})")

    def _stateless(self, stream: TurnStream,
                   make: Callable[[ModelRuntime], tuple[Job, Keeper]], scope: Scope,
                   user: str | None) -> Iterator[TurnUpdate]:
        """A stateless request's turn: its job made for the current model (make), run on a
        slot of that model's scheduler, its KV found by the prompt's tokens."""
        while True:  # until a slot of the current model's (a switch sends requests on)
            with self.using_model() as runtime:
                job, keeper = make(runtime)
            try:
                place = runtime.scheduler.reserve(scope=scope, prompt=job.prompt, owner=user)
            except Replaced:
                continue
            stream.bind(runtime.scheduler, place)
            started = False  # past its place in line
            try:
                for update in self._updates(
                        runtime.run_turn(place, job, keeper, self.observe_turn), job):
                    started = started or not update.queued
                    yield update
            except Replaced:  # the switch came before its slot: nothing was done
                continue
            if not started and runtime.retired and not stream.cancelled:
                continue  # stopped by a switch before its first token: the new model answers
            return


def text_tokens(runtime: ModelRuntime, prompt: str | list[int]) -> list[int]:
    """A completion's prompt as the model's tokens: token ids as they are; a text with its
    control tokens parsed and a BOS where the model wants one (unless the text begins with
    it). Empty, or too long for the context: refused."""
    engine = runtime.engine
    if isinstance(prompt, str):
        bos = engine.token_text(engine.bos_token) if engine.bos_token >= 0 else ""
        add_bos = engine.adds_bos and not (bos and prompt.startswith(bos))
        tokens = engine.tokenize(prompt, add_bos=add_bos, special=True)
    else:
        tokens = list(prompt)
        outside = next((t for t in tokens if not 0 <= t < engine.n_vocab), None)
        if outside is not None:
            raise ChatError(f"prompt: token {outside} is not in the model's vocabulary "
                            f"(0 to {engine.n_vocab - 1})")
    if not tokens:
        raise EmptyMessage("the prompt is empty: there is nothing to continue")
    if len(tokens) >= engine.n_ctx:
        raise MessageTooLong(f"The prompt is {len(tokens):,} tokens; the model's context "
                             f"holds {engine.n_ctx:,} tokens. Shorten it and send again.")
    return tokens
