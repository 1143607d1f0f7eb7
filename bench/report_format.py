"""What every bench report shares: the machine and its load, markdown tables, number formats,
a target's row, and saving figures (report.py, report_users.py and the single-question
benchmarks use these)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

from .systems import MB


def machine_info() -> dict:
    """CPU model, cores, RAM, versions: what the numbers depend on."""
    import llama_cpp
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu, "arch": platform.machine(), "cores": os.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 1024 ** 3, 1),
        "os": platform.platform(), "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
    }


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def secs(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def mb(n: float | None) -> str:
    return "n/a" if n is None else f"{n / MB:,.1f}"


def ratio(a: float | None, b: float | None) -> str:
    """How many times b is a (b / a), e.g. the speed-up of a over b."""
    if not a or b is None:
        return "n/a"
    return f"{b / a:,.1f}x"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} %"


def target_row(name: str, measured: str, hit: bool) -> dict:
    return {"target": name, "measured": measured, "hit": hit}


def save_figure(fig, path: Path) -> str:
    """Lay out, write and close a figure; its file name, for results.md."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


def log_ticks(ax, values: list[float]) -> None:
    """Readable ticks (0.1, 0.2, 0.5, 1, 2, 5, ...) on a log y axis."""
    low, high = min(values), max(values)
    ticks = [m * 10 ** e for e in range(-3, 4) for m in (1, 2, 5)]
    ticks = [t for t in ticks if low / 1.5 <= t <= high * 1.5]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(__import__("matplotlib").ticker.NullLocator())


def run_folder(base: Path, suffix: str = "") -> Path:
    """A run's results folder under base, named by its date and the commit measured
    (2026-12-07-1a2b3c4, "-dirty" when the tree has changes): runs never overwrite each
    other, and a figure can name the run it came from."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=base.parent if not base.exists() else base,
                              capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    return base / f"{time.strftime('%Y-%m-%d')}-{commit}{dirty}{suffix}"
