"""Gradio's import made lighter for a server: its type-stub writer skipped, pandas loaded
only if something uses it, no matplotlib backend switch around each call.

The type-stub writer (0.9 s off every start):

Gradio 6 writes or checks a `.pyi` type stub for every component class as the class is
defined (gradio/component_meta.py, create_or_modify_pyi, called from ComponentMeta): it reads
the class's source file, parses all of it, renders a Jinja template and compares it with the
stub on disk. That is tooling for Gradio's own developers and custom-component authors; a
server never reads the stubs, and for a subclass of a component it even writes one into the
subclass's package. Measured here (`import gradio`, 2 cores): 2.1-2.3 s with it, 1.2 s
without; it was most of Reame's start to /health 200.

A finder first on sys.meta_path replaces that one function, when gradio.component_meta is
loaded, by one that does nothing: right after the module runs and before any component class
is defined (Gradio's own import of it comes first). If a Gradio version has no such function,
nothing is replaced.

pandas: Gradio imports it at start (gradio/caching.py, `import pandas as pd`, used only to
hash DataFrames for gr.cache, which Reame does not use): 0.25-0.4 s of the start and about
40 MB of memory held for nothing. A second finder gives pandas Python's own lazy loader
(importlib.util.LazyLoader): the module object exists, and pandas runs the first time any
of its attributes is used, by whatever uses it (the same pandas, only later).

matplotlib: Gradio wraps every API call in a switch of matplotlib's backend to "agg" and back
(gradio.utils.MatplotlibBackendMananger, in route_utils.call_process_api), so that a plot drawn
by an event function is drawn off-screen. It imports matplotlib at the first call and, to name
the backend it switches back to, pyplot: 0.5 s of the first call and 13 MB held for good
(measured idle, SmolLM2, 4 slots: 641 MB with it imported, 628 without). Reame draws no plot,
so a third finder replaces that switch, when gradio.utils is loaded, by one that does nothing.

The MCP SDK: gradio/mcp.py imports the `mcp` package in the body of its GradioMCPServer class
(so at Gradio's import, in a try that passes on ImportError), for an MCP server Reame never
turns on: 0.4 s of every start (`python -X importtime`, 2 cores). A fourth finder runs
gradio.mcp with `mcp` not found while it runs, unless something imported `mcp` before
(the OpenAI Agents SDK, in the same process as a client: then it is there, at no cost).

`lighten_gradio_import()` installs the four; reame/web/__init__.py calls it before anything in
Reame imports Gradio.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

MODULE = "gradio.component_meta"
FUNCTION = "create_or_modify_pyi"
UTILS = "gradio.utils"
SWITCH = "MatplotlibBackendMananger"  # (sic)


def _no_stub(*args, **kwargs) -> None:
    """What a server needs of a component's type stub: nothing."""


class _NoBackendSwitch:
    """Gradio's matplotlib backend switch for a server that draws no plot: nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


class _Adapted(importlib.abc.MetaPathFinder):
    """One module found as the path finder finds it, its spec then adapted by adapt()."""

    def __init__(self, name: str, adapt) -> None:
        self.name, self.adapt = name, adapt

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader,
                                                                    "exec_module"):
            self.adapt(spec)
        return spec


def _replacing(name: str, by: object):
    """An adapt() that runs the module as it is, then replaces its attribute name by by (if
    the module has such a callable: another Gradio version may not)."""

    def adapt(spec: importlib.machinery.ModuleSpec) -> None:
        run = spec.loader.exec_module

        def run_then_replace(module: ModuleType) -> None:
            run(module)
            if callable(getattr(module, name, None)):
                setattr(module, name, by)

        spec.loader.exec_module = run_then_replace  # this spec's loader only

    return adapt


def _load_when_used(spec: importlib.machinery.ModuleSpec) -> None:
    """pandas (the top package only) with Python's lazy loader."""
    spec.loader = importlib.util.LazyLoader(spec.loader)


LAZY = "pandas"
GRADIO_MCP, MCP = "gradio.mcp", "mcp"


class _NoMcpWhile(importlib.abc.MetaPathFinder):
    """`mcp` (and its submodules) not found while gradio.mcp's module runs."""

    name = MCP
    active = False

    def find_spec(self, fullname, path, target=None):
        if self.active and (fullname == MCP or fullname.startswith(MCP + ".")):
            raise ModuleNotFoundError(f"No module named {fullname!r} (not for Gradio's import)",
                                      name=fullname)
        return None


_NO_MCP = _NoMcpWhile()


def _without_mcp(spec: importlib.machinery.ModuleSpec) -> None:
    """gradio.mcp run with `mcp` not found (_NO_MCP active) unless it is imported already."""
    run = spec.loader.exec_module

    def run_without(module: ModuleType) -> None:
        _NO_MCP.active = MCP not in sys.modules
        try:
            run(module)
        finally:
            _NO_MCP.active = False

    spec.loader.exec_module = run_without


def lighten_gradio_import() -> bool:
    """Install the finders (once); False if Gradio is imported already (too late)."""
    if MODULE in sys.modules:
        return False
    installed = {f.name for f in sys.meta_path if isinstance(f, _Adapted)}
    for name, adapt in ((MODULE, _replacing(FUNCTION, _no_stub)),
                        (UTILS, _replacing(SWITCH, _NoBackendSwitch)),
                        (LAZY, _load_when_used),
                        (GRADIO_MCP, _without_mcp)):
        if name not in installed and name not in sys.modules:
            sys.meta_path.insert(0, _Adapted(name, adapt))
    if _NO_MCP not in sys.meta_path:
        sys.meta_path.insert(0, _NO_MCP)
    return True
