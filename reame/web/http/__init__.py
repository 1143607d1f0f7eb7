"""The HTTP parts every face of the web layer shares: the guard in front of everything, logins,
connection limits, /health and /metrics, who is asking, uploads, a turn's updates for an async
handler, Gradio's queue polling. It imports none of the faces (page, v1, gradio_api)."""
