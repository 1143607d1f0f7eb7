"""Chats in and out of Reame: export to a documented JSON document (one chat, or all of them),
read one back, read ChatGPT's export (conversations.json), and show a chat's branch as Markdown.

Pure functions over what the store holds: nothing here touches the database or a model. The
caller stores what parse_import returns; an imported chat has no KV file until its first turn
builds one. The formats are described in docs/export-format.md.

An import file comes from anywhere: whatever its JSON shape, parse_import returns chats or raises
BadImport with a message for the person who uploaded it, never another exception.

export.py writes; importing.py reads (chatgpt.py: ChatGPT's format); checks.py holds what an
import becomes and the checks both formats share.
"""

from reame.chats.transfer.checks import BadImport, ImportedChat, ImportedMessage
from reame.chats.transfer.export import export_all, export_chat, to_markdown
from reame.chats.transfer.importing import parse_import

__all__ = ["BadImport", "ImportedChat", "ImportedMessage", "export_all", "export_chat",
           "parse_import", "to_markdown"]
