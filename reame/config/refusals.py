"""What a chat action can refuse, with a message for the person who asked, the checks of a
turn's inputs, and how long each kind of refused client is told to wait (Retry-After).

ChatNotFound (a chat that does not exist or is not the asker's) is a LookupError, not a
refusal: the APIs answer it as "not found".
"""

MAX_SEED = 2**32 - 2  # llama.cpp's seeds are 32-bit; 2**32 - 1 means "random"

# How long a refused client is told to wait, in seconds (HTTP's Retry-After).
RETRY_BUSY_S = 5  # ServerBusy: every slot busy and the line full, or the model being replaced
RETRY_LOADING_S = 2  # a model loads: that usually ends within seconds
RETRY_WARMING_S = 1  # the model runs once at start (reame/inference/warmup.py)
RETRY_NO_MODEL_S = 30  # no model loaded: an admin must act, come back later


class ChatError(Exception):
    """A turn or chat action that cannot be done as asked."""


class EmptyMessage(ChatError):
    """The message is empty or only whitespace."""


class MessageTooLong(ChatError):
    """The message alone does not fit in the model's context."""


class TooManyChats(ChatError):
    """The user keeps as many chats as the server allows one user."""


class NoModel(ChatError):
    """No model is loaded; the message says why."""


class DocumentRefused(ChatError):
    """A file that cannot be attached (its kind, its content); the words say why."""


class ServerBusy(ChatError):
    """Every slot is busy and the line of waiting turns is full: come back later."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after  # seconds


def check_seed(seed: int | None) -> None:
    if seed is not None and not (isinstance(seed, int) and 0 <= seed <= MAX_SEED):
        raise ChatError(f"a seed is an integer from 0 to {MAX_SEED}")


def check_text(text: str) -> None:
    if not text or not text.strip():
        raise EmptyMessage("the message is empty")


class ChatNotFound(LookupError):
    """No chat has this id."""

    def __init__(self, chat_id: object):
        super().__init__(f"chat {chat_id} does not exist")
        self.chat_id = chat_id
