"""The Settings panel's logic: show reame.conf, validate changes, write them, apply them live.

A change is validated first (every value against its declared range, the model file by
catalog.check_model), then applied (a new model is loaded while turns wait; if it fails the
current one keeps serving), and only then written to reame.conf: the file never names a model
that did not load.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reame.chats.service import ChatService
from reame.config.reame_conf import SETTINGS, Config, ConfigError, update_config, validate_value
from reame.inference.kv.kvstore import check_folder
from reame.models.catalog import ModelCheckError, check_model, list_models, model_folders
from reame.models.model_file import ModelLoadError
from reame.models.pull import Progress, Pulled, pull_model
from reame.runtime import load_runtime

log = logging.getLogger(__name__)

# Settings that take a new engine (and so a new KV fingerprint) to apply.
RELOAD = {("model", "model_path"), ("model", "n_ctx"), ("model", "n_threads"),
          ("cache", "kv_type"), ("cache", "enabled"), ("cache", "dir")}
# What the panel may change; [server] and [storage] need a restart and stay file-only.
EDITABLE = RELOAD | {(s.section, s.key) for s in SETTINGS if s.section == "generation"} | {
    ("cache", "max_disk_mb"), ("model", "models_dir")}
# Paths written back relative to reame.conf's folder when they lie inside it.
RELATIVE = {("model", "model_path"), ("model", "models_dir")}


class SettingsError(ValueError):
    """A settings change that was refused; nothing was written or applied."""


class Settings:
    """reame.conf as the running app sees it, and the one way to change it."""

    def __init__(self, config: Config, service: ChatService):
        self.config = config
        self.service = service

    @property
    def loading_model(self) -> Path | None:
        """The model being checked and loaded by an update in progress (replies wait)."""
        return self.service.loading_model

    @property
    def models_dir(self) -> Path:
        return self.config.model.models_dir

    def model_folders(self) -> list[Path]:
        """Where models() looks: [model] models_dir, and the current model's folder."""
        return model_folders(self.models_dir, self.config.model.model_path)

    def current(self) -> dict[str, Any]:
        values: dict[str, dict[str, Any]] = {}
        for item in SETTINGS:
            value = getattr(getattr(self.config, item.section), item.key)
            if (item.section, item.key) == ("storage", "database_url") and value:
                value = without_password(value)  # the tab shows it; the password stays out
            values.setdefault(item.section, {})[item.key] = (
                str(value) if isinstance(value, Path) else value)
        engine = self.service.engine
        return {"config_file": str(self.config.path) if self.config.path else None,
                "settings": values,
                "editable": sorted(f"{s}.{k}" for s, k in EDITABLE),
                "loaded_model": str(engine.model_path) if engine else None,
                "load_error": self.service.load_error,
                "loading": self.service.loading,
                "loading_model": str(self.loading_model) if self.loading_model else None}

    def public(self) -> dict[str, Any]:
        """What any user may know: the model's file name, whether one loads, the defaults of
        new chats. No path, file or server setting."""
        engine, loading = self.service.engine, self.loading_model
        return {"settings": {"generation": dataclasses.asdict(self.config.generation)},
                "editable": [],
                "loaded_model": engine.model_path.name if engine else None,
                "load_error": None if engine or loading else "no model is loaded",
                "loading": self.service.loading,
                "loading_model": loading.name if loading else None}

    def models(self) -> list[dict]:
        kv_type = self.config.cache.kv_type
        return [choice.as_dict(kv_type) for choice in
                list_models(self.models_dir, current=self.config.model.model_path)]

    def pull(self, repo_id: str, filename: str, *, revision: str | None = None,
             on_progress: Progress | None = None) -> Pulled:
        """Download a GGUF from the Hugging Face Hub into models_dir (see reame/models/pull.py);
        models() offers it next. The model serving is not changed."""
        return pull_model(repo_id, filename, self.models_dir, revision=revision,
                          on_progress=on_progress)

    def update(self, changes: dict[str, dict[str, Any]], *,
               on_step: Callable[[str, Path], None] | None = None) -> dict[str, Any]:
        """Validate, apply and save changes given as {section: {key: value}}.

        on_step(step, path) is told what happens as it happens: "checking" and "loading" (the
        model file; only when a model is loaded), then "saving" (reame.conf).
        """
        step = on_step or (lambda _step, _path: None)
        flat = {(section, key): value for section, keys in changes.items()
                for key, value in keys.items()}
        if not flat:
            raise SettingsError("no settings to change")
        base = self.config.base_dir
        typed: dict[tuple[str, str], Any] = {}
        for (section, key), value in flat.items():
            if (section, key) not in EDITABLE:
                raise SettingsError(f"[{section}] {key} cannot be changed here; edit "
                                    f"reame.conf and restart")
            try:
                typed[(section, key)] = validate_value(section, key, value, base)
            except ConfigError as exc:
                raise SettingsError(str(exc)) from None
        new_dir = typed.get(("cache", "dir"))
        if new_dir is not None and new_dir != self.config.cache.dir:
            try:
                check_folder(new_dir)
            except ValueError as exc:
                raise SettingsError(f"[cache] dir: {exc}") from None
        new_models = typed.get(("model", "models_dir"))
        if new_models is not None and new_models.exists() and not new_models.is_dir():
            raise SettingsError(f"[model] models_dir: {new_models} is not a folder")
        new_config = _with(self.config, typed)
        reload = any(key in RELOAD for key in typed) and self._differs(new_config)
        if reload or self.service.engine is None:
            with self.service.loading_from(new_config.model.model_path):
                step("checking", new_config.model.model_path)
                self._check(new_config)
                step("loading", new_config.model.model_path)
                self._load(new_config)
        self._apply_light(new_config)
        if self.config.path is not None:
            step("saving", self.config.path)
        self.config = self._save(new_config, typed, flat)
        return self.current()

    def _differs(self, new: Config) -> bool:
        old = self.config
        # models_dir is only where the picker looks: the engine does not change with it.
        model = dataclasses.replace(new.model, models_dir=old.model.models_dir)
        return (model != old.model or new.cache.kv_type != old.cache.kv_type
                or new.cache.enabled != old.cache.enabled or new.cache.dir != old.cache.dir)

    def _check(self, config: Config) -> None:
        engine = self.service.engine
        freed = engine.weight_bytes if engine else 0
        try:
            model = config.model
            check_model(model.model_path, n_ctx=model.n_ctx, kv_type=config.cache.kv_type,
                        freed_bytes=freed, slots=model.slots,
                        kv_budget_bytes=model.kv_ram_bytes, mmap=model.mmap,
                        engine_process=model.engine_process)
        except ModelCheckError as exc:
            raise SettingsError(str(exc)) from None

    def _load(self, config: Config) -> None:
        service = self.service

        def load():
            return load_runtime(config, service.store, service.limits)

        try:
            service.replace_runtime(load)
        except ModelLoadError as exc:
            raise SettingsError(f"{exc} The current model keeps serving.") from None
        service.reload_after_a_crash(load)

    def _apply_light(self, config: Config) -> None:
        self.service.set_defaults(config.generation)
        if self.service.cache is not None:
            self.service.cache.set_disk_budget(config.cache.max_disk_bytes)

    def _save(self, config: Config, typed: dict, flat: dict) -> Config:
        if self.config.path is None:
            return config
        to_write = {}
        for key, value in flat.items():
            if key in RELATIVE:
                value = _relative(typed[key], self.config.base_dir)
            to_write[key] = value
        try:
            return _keep_overrides(update_config(self.config.path, to_write), config)
        except (ConfigError, OSError) as exc:
            raise SettingsError(f"applied, but reame.conf could not be written: {exc}") from None


def _with(config: Config, typed: dict[tuple[str, str], Any]) -> Config:
    sections = {}
    for (section, key), value in typed.items():
        sections.setdefault(section, {})[key] = value
    return dataclasses.replace(config, **{
        section: dataclasses.replace(getattr(config, section), **values)
        for section, values in sections.items()})


def _keep_overrides(written: Config, running: Config) -> Config:
    """The file as written, with this run's command-line overrides (--model) kept."""
    return dataclasses.replace(written, model=dataclasses.replace(
        written.model, model_path=running.model.model_path))


def _relative(path: Path, base: Path) -> str:
    try:
        return str(Path(os.path.relpath(path, base))) if path.is_relative_to(base) else str(path)
    except ValueError:
        return str(path)


__all__ = ["Settings", "SettingsError", "EDITABLE", "RELOAD"]


def without_password(url: str) -> str:
    """A database URL as it may be shown: its password replaced by ***."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparsable: show nothing of it
        return "(a database URL)"
