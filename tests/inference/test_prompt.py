"""The prompt a conversation becomes, in the model's own chat template: a final assistant
message continued (a prefilled reply), system messages after the first turn where the template
allows them and folded into a user turn where it does not (Gemma 3's format), and a conversation the
template refuses as a clear error. The expected text is written out here, from each model's
template format, not computed by the code under test."""

from __future__ import annotations

import pytest

from reame.inference.engine import Engine
from reame.inference.prompt import PromptBuilder, PromptMessage, TemplateRefused

Q = "What is the capital city of France?"


def text_of(engine: Engine, tokens: list[int]) -> str:
    return engine.detokenize(tokens, special=True)


# A template in Gemma 3's format, written here: the first system message goes into the first
# user turn; roles must alternate, and a system message anywhere else is refused.
GEMMA_LIKE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{%- set first = messages[0]['content'] + '\n\n' %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set first = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- for message in rest %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{%- endif %}")


@pytest.fixture
def gemma_like(engine):
    saved = engine.chat_template
    engine.chat_template = GEMMA_LIKE
    try:
        yield PromptBuilder(engine)
    finally:
        engine.chat_template = saved


def test_a_final_assistant_message_is_continued(engine):
    prompts = PromptBuilder(engine)
    tokens = prompts.tokens("Be brief.", [PromptMessage("user", Q),
                                          PromptMessage("assistant", "The capital is ")])
    assert text_of(engine, tokens) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + Q
        + "<|im_end|>\n<|im_start|>assistant\nThe capital is ")
    # ... the same tokens as the words themselves after the reply's header: KV of a prefill is
    # the KV of the conversation up to there.
    header = prompts.tokens("Be brief.", [PromptMessage("user", Q)])
    assert tokens[:len(header)] == header
    assert tokens[len(header):] == engine.tokenize("The capital is ", special=False)


def test_a_later_system_message_stays_in_place_where_the_template_allows_it(engine):
    tokens = PromptBuilder(engine).tokens("", [
        PromptMessage("user", Q), PromptMessage("assistant", "Paris."),
        PromptMessage("system", "Answer in French."), PromptMessage("user", "And Italy?")])
    assert "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>system\nAnswer in French." \
           "<|im_end|>\n<|im_start|>user\nAnd Italy?<|im_end|>" in text_of(engine, tokens)


def test_gemma_gets_a_later_system_message_in_the_next_user_turn_and_continues_a_reply(
        engine, gemma_like):
    prompts, gemma = gemma_like, engine
    tokens = prompts.tokens("", [
        PromptMessage("user", Q), PromptMessage("assistant", "Paris."),
        PromptMessage("system", "Answer in French."), PromptMessage("user", "And Italy?")])
    text = text_of(gemma, tokens)
    assert "<start_of_turn>user\nAnswer in French.\n\nAnd Italy?<end_of_turn>" in text, text
    assert text.endswith("<start_of_turn>model\n")
    continued = text_of(gemma, prompts.tokens("", [PromptMessage("user", Q),
                                                   PromptMessage("assistant", "It is")]))
    assert continued.endswith(f"{Q}<end_of_turn>\n<start_of_turn>model\nIt is"), continued


def test_a_conversation_the_template_refuses_is_a_clear_error(gemma_like):
    with pytest.raises(TemplateRefused, match="roles must alternate"):
        gemma_like.tokens("", [PromptMessage("assistant", "Hello."),
                                         PromptMessage("assistant", "Again.")])
