"""The figures of the KV cache (the Cache panel, /cache_stats, /metrics): lookups, hits and
tokens restored per scope, the prefill rate that turns tokens restored into time saved, and
their totals, kept beside the KV files (a blob of their Blobs: blobs.py) so that they outlive
a restart."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from reame.inference.cache_state import Counts
from reame.inference.kv.blobs import Blobs, read_all
from reame.inference.kv.kvstore import TOTALS_NAME
from reame.inference.scope import Scope

log = logging.getLogger(__name__)

MIN_RATE_SAMPLE = 32  # prefills shorter than this say little about the prefill rate


class CacheFigures:
    """KVCache's figures (a mixin: KVCache.__init__ sets engine, files, prefill_rate, counts
    and _rates, then calls _load_totals)."""

    def record_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_RATE_SAMPLE and seconds > 0:
            rate = tokens / seconds
            self.prefill_rate = (rate if not self.prefill_rate
                                 else 0.8 * self.prefill_rate + 0.2 * rate)

    def count_saved(self, counts: Counts, tokens: int) -> None:
        """A hit's tokens not recomputed, and the time recomputing them would take at the
        prefill rate measured now."""
        counts.tokens_saved += tokens
        if self.prefill_rate:
            counts.seconds_saved += tokens / self.prefill_rate

    # The figures of the Cache panel outlive a restart: kept beside the files, the prefill
    # rate per model (it turns tokens restored into time saved).

    @property
    def _totals_blobs(self) -> Blobs | None:
        return self.files.blobs if self.files is not None else None

    def _load_totals(self) -> None:
        blobs = self._totals_blobs
        try:
            raw = read_all(blobs, TOTALS_NAME) if blobs else None
            if raw is None:
                return
            data = json.loads(raw.decode("utf-8"))
            rates = dict(data.get("prefill_rates", {}))
            rate = rates.get(self.engine.fingerprint, 0.0)
            counts = {Scope(str(scope)): _counts(numbers, rate)
                      for scope, numbers in data.get("counts", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("the cache's totals in %s are unreadable (%s): starting from zero",
                        blobs.where, exc)
            return
        self._rates = rates
        if isinstance(rate, (int, float)) and rate > 0:
            self.prefill_rate = float(rate)
        self.counts.update(counts)

    def _save_totals(self) -> None:
        """Write the totals (at each save: one small file, the other models' rates as read
        at start-up, not read again)."""
        blobs = self._totals_blobs
        if blobs is None:
            return
        if self.prefill_rate:
            self._rates[self.engine.fingerprint] = round(self.prefill_rate, 2)
        data = {"prefill_rates": self._rates, "counts": {
            scope: [c.lookups, c.hits, c.tokens_saved, round(c.seconds_saved, 3)]
            for scope, c in self.counts.items()}}
        try:
            # Atomic (nodes sharing the folder may write it at once); per-user counts: in
            # the folder, a file not readable by others.
            blobs.put(TOTALS_NAME, [json.dumps(data).encode("utf-8")])
        except OSError as exc:
            log.warning("could not keep the cache's totals in %s: %s", blobs.where, exc)

    def chats_ready(self, chat_ids: Iterable[int]) -> int:
        """How many of these chats have a KV file of this model to continue from (a running
        count of the files: KVStore.ready_chats; no file is looked at)."""
        if self.files is None:
            return 0
        ready = self.files.ready_chats()
        return sum(chat_id in ready for chat_id in chat_ids)

    def stats(self, scope: Scope | None = None) -> dict:
        """Lookups, hits and tokens restored: of one scope, or (None) of the whole server with
        its files (for an administrator)."""
        counts = ([self.counts.get(scope, Counts())] if scope is not None
                  else list(self.counts.values()))
        lookups = sum(c.lookups for c in counts)
        hits = sum(c.hits for c in counts)
        saved = sum(c.tokens_saved for c in counts)
        out = {"enabled": self.enabled, "prefill_tokens_per_s": round(self.prefill_rate, 1),
               "lookups": lookups, "hits": hits,
               "hit_rate": round(hits / lookups, 3) if lookups else None,
               "tokens_restored": saved,
               "time_saved_s": round(sum(c.seconds_saved for c in counts), 2)}
        if self.files is not None and scope is None:
            files = self.files.listing()
            out.update(files=len(files), disk_bytes=sum(b.size for b in files),
                       max_disk_bytes=self.files.max_bytes, dir=self.files.blobs.where,
                       counters=self.files.counters.as_dict())
        return out


def _counts(numbers: list, rate: object) -> Counts:
    """Counts as kept: lookups, hits, tokens saved and seconds saved (a file of an earlier
    version has no seconds: its tokens at the rate kept with it)."""
    lookups, hits, tokens = (int(n) for n in numbers[:3])
    if len(numbers) > 3:
        seconds = float(numbers[3])
    else:
        seconds = tokens / rate if isinstance(rate, (int, float)) and rate > 0 else 0.0
    return Counts(lookups, hits, tokens, seconds)
