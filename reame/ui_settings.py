"""The Settings tab and the Cache panel: layout and thin handlers over Settings and ChatService."""

from __future__ import annotations

import gradio as gr

from .chat import ChatService
from .settings import Settings, SettingsError


def model_label(model: dict) -> str:
    if "error" in model:
        return f"{model['path']} — unreadable: {model['error']}"
    size = model["size_bytes"] / 2**20
    params = model["parameters"] / 1e6
    kv = model["kv_bytes_per_token"]
    return (f"{model['file']} — {model['architecture']}, {params:,.0f}M params, "
            f"{model['quantization']}, {size:,.0f} MB, trained context "
            f"{model['context_length'] or '?':,}, chat template "
            f"{'yes' if model['chat_template'] else 'no'}, KV {kv / 1024:,.1f} KB/token"
            if kv else f"{model['file']} — {model['architecture']}, {model['quantization']}")


def cache_markdown(service: ChatService) -> str:
    s = service.cache_stats()
    if not s.get("enabled"):
        return "The disk cache is **off** (`[cache] enabled = false`): only the live context is reused."
    hit_rate = f"{s['hit_rate']:.0%}" if s["hit_rate"] is not None else "—"
    if s["prefill_tokens_per_s"]:
        saved = (f"**{s['time_saved_s']:,.1f} s** "
                 f"(at {s['prefill_tokens_per_s']:,.0f} tok/s prefill)")
    else:
        saved = "not measured yet (needs one prefill of 32+ tokens in this run)"
    c = s["counters"]
    return (f"**{s['files']}** KV files · **{s['disk_bytes'] / 2**20:,.1f} MB** of "
            f"{s['max_disk_bytes'] / 2**20:,.0f} MB\n\n"
            f"hit rate **{hit_rate}** ({s['hits']} of {s['lookups']} lookups) · "
            f"**{s['tokens_restored']:,}** tokens restored · time saved {saved}\n\n"
            f"unusable files replaced: {c['rejected']} · failed writes: "
            f"{c['write_errors']} · evicted: {c['evicted']}")


def build_settings_tab(settings: Settings, *, concurrency_id: str) -> None:
    """Render the Settings tab's content (call inside a gr.Tab)."""
    status = gr.Markdown(elem_id="settings-status")
    with gr.Row():
        picker = gr.Dropdown(label="Model (from models/)", elem_id="model-picker", scale=3,
                             allow_custom_value=False)
        refresh = gr.Button("Rescan models/", elem_id="rescan-models", scale=0, size="sm")
    other_path = gr.Textbox(label="…or a GGUF file elsewhere (path)", elem_id="model-path")
    with gr.Row():
        n_ctx = gr.Number(label="n_ctx (256–131072)", precision=0, elem_id="n-ctx")
        n_threads = gr.Number(label="n_threads (0 = all cores)", precision=0, elem_id="n-threads")
        kv_type = gr.Radio(["f16", "q8_0"], label="KV cache type", elem_id="kv-type")
    with gr.Row():
        cache_enabled = gr.Checkbox(label="Disk cache on", elem_id="cache-enabled")
        max_disk = gr.Number(label="Cache disk budget (MB)", precision=0, elem_id="max-disk")
    gr.Markdown("Defaults for new chats")
    system_prompt = gr.Textbox(label="System prompt", lines=2, elem_id="default-system-prompt")
    with gr.Row():
        temperature = gr.Number(label="Temperature (0–2)", elem_id="default-temperature")
        top_p = gr.Number(label="Top p (0–1)", elem_id="default-top-p")
        max_tokens = gr.Number(label="Max tokens", precision=0, elem_id="default-max-tokens")
    apply = gr.Button("Apply and save to reame.conf", variant="primary", elem_id="apply-settings")
    fields = [picker, other_path, n_ctx, n_threads, kv_type, cache_enabled, max_disk,
              system_prompt, temperature, top_p, max_tokens]

    def status_text() -> str:
        now = settings.current()
        if now["loading"]:
            return "**Loading model…** replies wait until it is ready."
        if now["load_error"]:
            return f"**No model is loaded.** {now['load_error']}"
        return f"Serving `{now['loaded_model']}` · settings file `{now['config_file']}`"

    def show():
        now = settings.current()["settings"]
        models = settings.models()
        choices = [(model_label(m), m["path"]) for m in models]
        loaded = settings.service.engine.model_path if settings.service.engine else None
        chosen = next((m["path"] for m in models if loaded and m["path"] == str(loaded)), None)
        return (status_text(), gr.Dropdown(choices=choices, value=chosen),
                "" if chosen or loaded is None else str(loaded), now["model"]["n_ctx"],
                now["model"]["n_threads"], now["cache"]["kv_type"], now["cache"]["enabled"],
                now["cache"]["max_disk_mb"], now["generation"]["system_prompt"],
                now["generation"]["temperature"], now["generation"]["top_p"],
                now["generation"]["max_tokens"])

    def save(picked, path, ctx, threads, kv, enabled, disk, prompt, temp, top, max_tok,
             progress=gr.Progress()):
        now = settings.current()["settings"]
        wanted = {
            "model": {"model_path": (path or "").strip() or picked or now["model"]["model_path"],
                      "n_ctx": ctx, "n_threads": threads},
            "cache": {"kv_type": kv, "enabled": enabled, "max_disk_mb": disk},
            "generation": {"system_prompt": prompt, "temperature": temp, "top_p": top,
                           "max_tokens": max_tok},
        }
        changes = {section: {k: v for k, v in keys.items() if v is not None and v != now[section][k]}
                   for section, keys in wanted.items()}
        changes = {section: keys for section, keys in changes.items() if keys}
        if not changes:
            gr.Info("Nothing changed.")
            return show()
        progress(0.1, desc="Checking and loading…")
        try:
            settings.update(changes)
        except SettingsError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        gr.Info("Saved to reame.conf and applied.")
        return show()

    outputs = [status, *fields]
    gr.on([refresh.click], show, None, outputs, api_visibility="private")
    apply.click(save, fields, outputs, concurrency_id=concurrency_id, concurrency_limit=1,
                api_visibility="private")
    return show, outputs
