"""The named API for gradio_client (/send, /get_chat, ...), and Gradio's import made lighter.
It imports reame.web.http, never the page or /v1."""
