"""The web layer: the page and its Settings tab, the named API, /v1, logins and the guard in
front of them. app.py composes them side by side; nothing outside this folder imports it."""

from reame.web.gradio_api.gradio_import import lighten_gradio_import

lighten_gradio_import()  # before any module here imports Gradio: about 1 s off every start
