"""The model's vocabulary: text to tokens and back, as the Engine offers it (a mixin over
Engine's _model and _vocab), and a TextStream that turns tokens into text as they come."""

from __future__ import annotations

import codecs
import ctypes

import llama_cpp


class TextStream:
    """Turns tokens into text as they arrive, holding back incomplete UTF-8 sequences."""

    def __init__(self, engine: "Vocabulary"):
        self._engine = engine
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._engine.token_piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


class Vocabulary:
    """Engine's tokens and text (a mixin: Engine.__init__ loads the model)."""

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        """Tokenize; special: control tokens written as text ("<|im_end|>") are parsed (a
        chat template's text), else they stay characters (what people write)."""
        if not text:
            return [self.bos_token] if add_bos and self.bos_token >= 0 else []
        return self._model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return self._model.detokenize(tokens, special=special).decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> int:
        return self._model.token_bos()

    @property
    def eos_token(self) -> int:
        return self._model.token_eos()

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def _longest_token(self) -> int:
        """An upper bound of a token's length in bytes, from the vocabulary's texts (they
        spell a byte in one to six bytes: "Ġ", "<0x0A>"), so that n bytes of text are surely
        more than n / this many tokens. About 50 ms for 49k tokens, paid when the model loads."""
        return max(len(llama_cpp.llama_vocab_get_text(self._vocab, t) or b"")
                   for t in range(self.n_vocab))

    def token_text(self, token: int, *, special: bool = True) -> str:
        return self.token_piece(token, special=special).decode("utf-8", errors="replace")

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return ctypes.string_at(buf, n)

    def is_end(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def text_stream(self) -> TextStream:
        return TextStream(self)
