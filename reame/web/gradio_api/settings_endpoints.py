"""The named endpoints of the server's settings (gradio_client's /get_settings, /list_models,
/update_settings): reame.conf as the app runs it, the model files there are, a change validated
and made live. With accounts, only an admin may list the models or change anything."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from reame.admin.live_settings import Settings, SettingsError
from reame.web.gradio_api.guarded import guarded, user_error
from reame.web.http.user import user_of


def register_settings_endpoints(settings: Settings, *, settings_group: str,
                       can_configure: Callable[[str | None], bool]) -> None:
    def get_settings(request: gr.Request = None) -> dict:
        """reame.conf as the app runs it, the loaded model, and what can be changed here.

        With accounts, a user who is not an admin gets the loaded model's file name and the
        defaults of new chats only: no paths, files or server settings."""
        if not can_configure(user_of(request)):
            return settings.public()
        return settings.current()

    def list_models(request: gr.Request = None) -> list[dict]:
        """Every .gguf in models_dir and beside the current model, described from its header
        (nothing is loaded); each one's `model_path` is what update_settings takes. Admins
        only when there are accounts."""
        if not can_configure(user_of(request)):
            raise gr.Error("only an admin can list the model files", print_exception=False)
        # Not "path": Gradio takes a dict with a "path" for a file to send, and the client
        # then asks for the model file itself (refused: 403).
        return [{("model_path" if key == "path" else key): value for key, value in m.items()}
                for m in settings.models()]

    def update_settings(changes: dict, request: gr.Request = None) -> dict:
        """Change settings, e.g. {"model": {"model_path": "models/x.gguf", "n_ctx": 2048}}.

        Validated first; a new model is loaded while replies wait; reame.conf is written last.
        With accounts, only an admin may.
        """
        if not can_configure(user_of(request)):
            raise gr.Error("only an admin can change the settings", print_exception=False)
        if not isinstance(changes, dict) or not all(isinstance(v, dict) for v in changes.values()):
            raise gr.Error('expected {"section": {"key": value}}', print_exception=False)
        try:
            return settings.update(changes)
        except SettingsError as exc:
            raise user_error(exc) from None

    for fn in (get_settings, list_models):
        gr.api(guarded(fn), api_name=fn.__name__, concurrency_limit=None)
    # Loading a model waits for replies in progress, and replies wait for it.
    gr.api(guarded(update_settings), api_name="update_settings",
           concurrency_id=settings_group, concurrency_limit=1)
