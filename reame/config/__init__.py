"""What can be set and what can be refused: reame.conf's settings (reame_conf, each declared
with setting.Setting), a chat's own settings (chat_settings), the connection limits, and the
refusals every layer above raises (refusals). The lowest layer: it imports nothing of Reame."""
