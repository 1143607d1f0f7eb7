"""How many slots' KV fit in the memory set aside for it ([model] kv_ram_mb): the engine
takes that many, and the catalog says so before a model is loaded."""

from __future__ import annotations

import logging

from reame.models.model_file import ModelLoadError

log = logging.getLogger(__name__)


def slots_that_fit(wanted: int, n_ctx: int, per_slot: int | None,
                   budget: int | None) -> int:
    """How many of the wanted slots' KV (per_slot bytes each: n_ctx tokens, GGUFInfo.
    kv_bytes_per_slot) fit in budget bytes; ModelLoadError if not even one does. Without a
    budget or a known size per slot: all of them."""
    if budget is None or not per_slot:
        return wanted
    fit = budget // per_slot
    if fit < 1:
        raise ModelLoadError(
            f"one chat's KV at n_ctx {n_ctx:,} takes {per_slot / 2**20:,.0f} MB with this "
            f"model, more than the {budget / 2**20:,.0f} MB of [model] kv_ram_mb: lower n_ctx "
            "or raise kv_ram_mb")
    if fit < wanted:
        log.warning("%d of %d slots fit in [model] kv_ram_mb (%d MB per slot at n_ctx %d)",
                    fit, wanted, per_slot // 2**20, n_ctx)
    return min(wanted, fit)
