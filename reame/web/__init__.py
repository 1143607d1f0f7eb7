"""The web layer: the page and its Settings tab, the named API, /v1, logins and the guard in
front of them. app.py composes them side by side; nothing outside this folder imports it."""

from reame.web.gradio_stubs import skip_stub_writer

skip_stub_writer()  # before any module here imports Gradio: 0.9 s off every start
