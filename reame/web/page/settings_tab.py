"""The Settings tab and the Cache panel: layout and thin handlers over Settings and ChatService."""

from __future__ import annotations

import html
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr

from reame.admin.live_settings import Settings, SettingsError
from reame.chats.service import ChatService
from reame.config.reame_conf import setting
from reame.models.pull import Pulled, PullError
from reame.web.http.user import user_of
from reame.web.page.render import inert_html

log = logging.getLogger(__name__)

# Apply is at the bottom of the tab, its status and progress bar at the top: scroll up to them.
SCROLL_TO_STATUS = """(...values) => {
    document.getElementById("settings-status")?.scrollIntoView({block: "nearest"});
    return values;
}"""
# The steps of an Apply that loads a model, as its progress bar counts them.
STEPS = {"checking": (1, "Checking"), "loading": (2, "Loading"), "saving": (3, "Saving")}


def model_label(model: dict) -> str:
    if "error" in model:
        return f"{model['path']} — unreadable: {model['error']}"
    size = model["size_bytes"] / 2**20
    params = model["parameters"] / 1e6
    kv = model["kv_bytes_per_token"]
    return (f"{model['file']} — {model['architecture']}, {params:,.0f}M params, "
            f"{model['quantization']}, {size:,.0f} MB, trained context "
            f"{model['context_length'] or '?':,}, chat template "
            f"{'yes' if model['chat_template'] else 'no'}, memory per token of history "
            f"{kv / 1024:,.1f} KB (KV)"
            if kv else f"{model['file']} — {model['architecture']}, {model['quantization']}")


def _ranged(label: str, section: str, key: str) -> str:
    """A setting's label with its range, e.g. "Temperature (0–2)"."""
    item = setting(section, key)
    return f"{label} ({item.minimum:g}–{item.maximum:g})"


def loading_text(path: Path | str) -> str:
    return f"**Loading model** `{Path(path).name}`… replies wait until it is ready."


def banner_texts(service: ChatService, loading: Path | str | None = None) -> tuple:
    """The Chat tab's model line and its error box: the text of each, None where hidden."""
    if loading:
        return loading_text(loading), None
    engine = service.engine
    if engine is None:
        return None, f"**The model could not be loaded.** {inert_html(service.load_error or '')}"
    return f"Model: `{engine.name}` · context {engine.n_ctx:,} tokens", None


def model_banner(service: ChatService, loading: Path | str | None = None) -> tuple:
    """Updates for the Chat tab's model line and its error box, in that order."""
    return tuple(gr.update(visible=False) if text is None else gr.update(value=text, visible=True)
                 for text in banner_texts(service, loading))


# The KV cache types as the Settings tab names them.
KV_TYPES = {"f16": "Exact (f16)", "q8_0": "Half the memory, nearly the same replies (q8_0)"}


def cache_markdown(service: ChatService, user: str | None = None, *,
                   whole_server: bool = True) -> str:
    """The Cache panel: one line in plain words (time saved, chats ready to continue), the
    figures on demand. An administrator (or a server without accounts) sees the whole
    server's and its files; another user, those of their own turns and chats."""
    s = service.cache_stats(user, whole_server=whole_server)
    if not s.get("enabled"):  # the line is HTML: no Markdown in it
        if service.runtime is None:  # no model (missing, or not loaded): no cache either
            return ('<p class="reame-cache-line">No model is loaded, so no chat is kept ready '
                    "to continue yet.</p>")
        return ('<p class="reame-cache-line">The disk cache is <strong>off</strong> '
                "(<code>[cache] enabled = false</code>): only the live context is reused.</p>")
    restored = s["tokens_restored"]
    if s["prefill_tokens_per_s"] and s["time_saved_s"] >= 0.5:  # never "≈ 0 s saved"
        saved = f"≈ {_duration(s['time_saved_s'])} of recomputation saved"
    elif restored:
        saved = f"{restored:,} tokens restored instead of recomputed"
    else:  # a first visit: no "0 tokens restored · 0 chats ready"
        saved = ""
    ready = s["chats_ready"]
    # An admin's figures are the whole server's: not to be read as their own chats'.
    where = " on the server" if whole_server and user is not None else ""
    chats = (f"{ready:,} chat{'' if ready == 1 else 's'}{where} ready to continue" if ready
             else f"no chat{where} is kept ready to continue yet")
    line = (f"{saved} · {chats}" if saved else chats if ready
            else f"{chats[0].upper()}{chats[1:]}.")
    rate = (f"at {s['prefill_tokens_per_s']:,.0f} tokens/s, this machine's prefill speed"
            if s["prefill_tokens_per_s"] else "the prefill speed is measured at the first "
            "long enough prompt")
    details = [f"{restored:,} tokens of history restored instead of recomputed "
               f"({rate})",
               f"{s['hits']:,} of {s['lookups']:,} look-ups found history to reuse (a file, or an "
               "opening shared with another chat still in memory)"]
    if "counters" in s:
        c = s["counters"]
        details += [f"{s['files']:,} KV files, {s['disk_bytes'] / 2**20:,.1f} MB of "
                    f"{s['max_disk_bytes'] / 2**20:,.0f} MB allowed (the oldest go first)",
                    f"unusable files replaced: {c['rejected']} · failed writes: "
                    f"{c['write_errors']} · evicted: {c['evicted']}"]
    items = "".join(f"<li>{html.escape(d)}</li>" for d in details)
    return (f'<p class="reame-cache-line">{html.escape(line)}</p>'
            f'<details class="reame-cache-details"><summary>Details</summary><ul>{items}</ul>'
            "</details>")


def picker_info(found: int, folders: list[Path]) -> str:
    """Under the model picker: where it looked (models_dir, and the current model's folder
    when it lies elsewhere), and what it found there."""
    if not found:
        return (f"No .gguf file in {' or '.join(map(str, folders))}. Put GGUF files in "
                f"{folders[0]} (or download one below) and press Rescan, or give a path below.")
    return (f"{found} model file{'s' if found != 1 else ''} in "
            f"{' and '.join(map(str, folders))}")


def pulled_markdown(pulled: Pulled) -> str:
    """Under the Download box once the file is there: where, and how to switch to it."""
    where = f"`{pulled.path.name}` ({pulled.info.size / 2**20:,.0f} MB, checksum verified)"
    done = (f"Downloaded {where} into `{pulled.path.parent}`" if pulled.downloaded else
            f"{where} is in `{pulled.path.parent}` already")
    return f"{done}. It is selected in the model picker: **Apply** switches to it."


def _duration(seconds: float) -> str:
    """12 s, 3 min, 1.5 h: a time in the unit people say."""
    if seconds < 90:
        return f"{seconds:,.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds / 3600:,.1f} h"


def build_settings_tab(settings: Settings, *, settings_group: str,
                       banner: list[gr.Markdown],
                       can_configure: Callable[[str | None], bool] = lambda user: True) -> tuple:
    """Render the Settings tab's content (call inside a gr.Tab).

    banner: the Chat tab's model line and error box (see model_banner), kept up to date by Apply.
    Returns the function that fills the tab and the components it fills, for the page's load.
    """
    service = settings.service
    status = gr.Markdown(elem_id="settings-status")
    with gr.Row():
        picker = gr.Dropdown(label="Model", elem_id="model-picker", scale=3,
                             allow_custom_value=False)
        refresh = gr.Button("Rescan", elem_id="rescan-models", scale=0, size="sm")
    other_path = gr.Textbox(label="…or a GGUF file elsewhere (path)", elem_id="model-path")
    with gr.Group(elem_id="pull-box"):
        with gr.Row():
            pull_repo = gr.Textbox(label="Download from Hugging Face: repository",
                                   placeholder="owner/Model-GGUF", elem_id="pull-repo", scale=2)
            pull_file = gr.Textbox(label="File in it (.gguf)", placeholder="model.Q4_K_M.gguf",
                                   elem_id="pull-file", scale=2)
            pull = gr.Button("Download", elem_id="pull-model", scale=0)
        pull_status = gr.Markdown(elem_id="pull-status")
    with gr.Row():
        n_ctx = gr.Number(label=_ranged("Context length in tokens (n_ctx)", "model", "n_ctx"), precision=0, elem_id="n-ctx")
        n_threads = gr.Number(label="CPU threads (n_threads; 0 = all cores)", precision=0, elem_id="n-threads")
        # In plain words, the format's name as the hint ("f16/q8_0" alone said nothing).
        kv_type = gr.Radio([(KV_TYPES.get(kind, kind), kind)
                            for kind in setting("cache", "kv_type").choices],
                           label="How a chat's memory is stored (KV cache type)",
                           elem_id="kv-type")
    with gr.Row():
        cache_enabled = gr.Checkbox(label="Keep chats' history on disk (the KV cache)", elem_id="cache-enabled")
        max_disk = gr.Number(label="Disk space for it (MB)", precision=0, elem_id="max-disk")
    gr.Markdown("Defaults for new chats")
    system_prompt = gr.Textbox(label="System prompt", lines=2, elem_id="default-system-prompt")
    with gr.Row():
        temperature = gr.Number(label=_ranged("Temperature", "generation", "temperature"),
                                elem_id="default-temperature")
        top_p = gr.Number(label=_ranged("Top p", "generation", "top_p"), elem_id="default-top-p")
        max_tokens = gr.Number(label=_ranged("Max tokens", "generation", "max_tokens"), precision=0,
                               elem_id="default-max-tokens")
    apply = gr.Button("Apply", variant="primary", elem_id="apply-settings")
    gr.Markdown("Apply checks the settings, loads the model if it changed, and keeps them in "
                "the server's `reame.conf`.", elem_classes=["reame-hint"])
    fields = [picker, other_path, n_ctx, n_threads, kv_type, cache_enabled, max_disk,
              system_prompt, temperature, top_p, max_tokens]

    def status_text(error: str | None = None) -> str:
        now = settings.current()
        if now["loading"]:
            return loading_text(now["loading_model"] or now["loaded_model"] or "")
        if now["load_error"]:
            text = f"**No model is loaded.** {inert_html(now['load_error'])}"
        else:
            text = f"Serving `{now['loaded_model']}` · settings file `{now['config_file']}`"
        if error:
            text = f"**Not applied:** {inert_html(error)}\n\n{text}"
        return text

    def picker_update(select: str | None = None) -> tuple[gr.Dropdown, str | None]:
        """The picker with the model files there are now; select (a path), or else the
        loaded model when it is listed, chosen."""
        models = settings.models()
        paths = [m["path"] for m in models]
        loaded = str(service.engine.model_path) if service.engine else None
        chosen = select if select in paths else loaded if loaded in paths else None
        return gr.Dropdown(choices=[(model_label(m), m["path"]) for m in models], value=chosen,
                           info=picker_info(len(models), settings.model_folders())), chosen

    def show(request: gr.Request = None):
        if not can_configure(user_of(request)):
            # Who may not change the settings does not see them (paths, files): the model
            # line alone. The tab is hidden from them too; this also answers a direct call.
            return (gr.skip(), *model_banner(service, settings.loading_model),
                    *(gr.skip() for _ in fields))
        now = settings.current()["settings"]
        loaded = service.engine.model_path if service.engine else None
        dropdown, chosen = picker_update()
        return (status_text(), *model_banner(service, settings.loading_model), dropdown,
                "" if chosen or loaded is None else str(loaded), now["model"]["n_ctx"],
                now["model"]["n_threads"], now["cache"]["kv_type"], now["cache"]["enabled"],
                now["cache"]["max_disk_mb"], now["generation"]["system_prompt"],
                now["generation"]["temperature"], now["generation"]["top_p"],
                now["generation"]["max_tokens"])

    def save(picked, path, ctx, threads, kv, enabled, disk, prompt, temp, top, max_tok,
             request: gr.Request, progress=gr.Progress()):
        """Apply: validate, load (with the steps shown as they happen), save."""
        if not can_configure(user_of(request)):
            # Not status_text: it names the model's and the settings file's paths.
            gr.Warning("Only an admin can change the settings.")
            yield ("**Not applied:** only an admin can change the settings.",
                   *model_banner(service), *[gr.skip()] * len(fields))
            return
        now = settings.current()["settings"]
        wanted = {
            "model": {"model_path": (path or "").strip() or picked or now["model"]["model_path"],
                      "n_ctx": ctx, "n_threads": threads},
            "cache": {"kv_type": kv, "enabled": enabled, "max_disk_mb": disk},
            "generation": {"system_prompt": prompt, "temperature": temp, "top_p": top,
                           "max_tokens": max_tok},
        }
        changes = {section: {k: v for k, v in keys.items()
                             if v is not None and v != now[section][k]}
                   for section, keys in wanted.items()}
        changes = {section: keys for section, keys in changes.items() if keys}
        if not changes:
            gr.Info("Nothing changed.")
            yield show(request)
            return
        # The update runs in a thread so that each of its steps reaches the page as it starts:
        # the status and the Chat tab say "Loading model", the bar counts the steps. (So does
        # a download's progress, below.)
        progress(0, desc="Checking the values…")
        skip = [gr.skip()] * len(fields)
        for step, value in steps_from_thread(
                lambda put: settings.update(changes, on_step=put),
                SettingsError, "applying settings", "apply-settings"):
            if step in STEPS:
                n, verb = STEPS[step]
                progress((n, len(STEPS)), desc=f"{verb} {value.name}…", unit="steps")
                if step == "checking":
                    yield (loading_text(value), *model_banner(service, value), *skip)
            elif step == "done":
                gr.Info("Saved to reame.conf and applied.")
                yield show(request)
                return
            else:
                # A warning, not gr.Error: the status keeps the message, no "Error" badge
                # covers the form, and the fields keep what the user entered, to be corrected.
                gr.Warning(value)
                yield (status_text(value), *model_banner(service), *skip)
                return

    def download(repo, filename, request: gr.Request, progress=gr.Progress()):
        """Download a GGUF from the Hub into models_dir, then offer it in the picker (the
        model serving stays: Apply switches)."""
        if not can_configure(user_of(request)):
            gr.Warning("Only an admin can download models.")
            yield "**Not downloaded:** only an admin can download models.", gr.skip()
            return
        progress(0, desc="Asking the Hub…")
        for kind, value in steps_from_thread(
                lambda put: settings.pull(repo or "", filename or "",
                                          on_progress=lambda done, total: put("bytes",
                                                                               (done, total))),
                PullError, "downloading a model", "pull-model"):
            if kind == "bytes":
                done, total = value
                progress((done // 2**20, max(total // 2**20, 1)), unit="MB",
                         desc="Checking the checksum…" if done >= total else "Downloading…")
            elif kind == "done":
                gr.Info(f"{value.path.name} is ready: Apply switches to it.")
                yield pulled_markdown(value), picker_update(select=str(value.path))[0]
                return
            else:
                gr.Warning(value)
                yield f"**Not downloaded:** {inert_html(value)}", gr.skip()
                return

    outputs = [status, *banner, *fields]
    gr.on([refresh.click], show, None, outputs, api_visibility="private")
    apply.click(save, fields, outputs, concurrency_id=settings_group, concurrency_limit=1,
                show_progress_on=[picker], api_visibility="private", js=SCROLL_TO_STATUS)
    # One download at a time (a second of the same file would be refused anyway); it does
    # not wait for Apply, nor Apply for it.
    pull.click(download, [pull_repo, pull_file], [pull_status, picker],
               concurrency_id="pull-model", concurrency_limit=1, api_visibility="private",
               show_progress_on=[pull_status])
    return show, outputs


def steps_from_thread(work: Callable[[Callable[[str, object], None]], object],
                      refusal: type[Exception], doing: str,
                      name: str) -> Iterator[tuple[str, object]]:
    """Run work(put) in a thread of its own and yield, as they come, the (kind, value) it
    puts, then ("done", what it returned) or ("error", the message to show): a refusal's own
    words, anything else as an unexpected error (logged in full)."""
    events: queue.SimpleQueue = queue.SimpleQueue()

    def run():
        try:
            events.put(("done", work(lambda kind, value: events.put((kind, value)))))
        except refusal as exc:
            events.put(("error", str(exc)))
        except Exception as exc:  # noqa: BLE001 - shown to the user, logged in full
            log.exception("%s failed", doing)
            events.put(("error", f"unexpected error: {exc}"))

    threading.Thread(target=run, name=name, daemon=True).start()
    while True:
        kind, value = events.get()
        yield kind, value
        if kind in ("done", "error"):
            return
