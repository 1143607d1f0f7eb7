"""Gradio without its type-stub writer: 0.9 s off every start.

Gradio 6 writes or checks a `.pyi` type stub for every component class as the class is
defined (gradio/component_meta.py, create_or_modify_pyi, called from ComponentMeta): it reads
the class's source file, parses all of it, renders a Jinja template and compares it with the
stub on disk. That is tooling for Gradio's own developers and custom-component authors; a
server never reads the stubs, and for a subclass of a component it even writes one into the
subclass's package. Measured here (`import gradio`, 2 cores): 2.1-2.3 s with it, 1.2 s
without; it was most of Reame's start to /health 200.

`skip_stub_writer()` puts a finder first on sys.meta_path that, when gradio.component_meta is
loaded, replaces that one function by one that does nothing, right after the module runs and
before any component class is defined (Gradio's own import of it comes first). If a Gradio
version has no such function, nothing is replaced. Installed by reame/web/__init__.py, before
anything in Reame imports Gradio.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MODULE = "gradio.component_meta"
FUNCTION = "create_or_modify_pyi"


def _no_stub(*args, **kwargs) -> None:
    """What a server needs of a component's type stub: nothing."""


class _StubWriterSkipped(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def run_then_skip(module: ModuleType) -> None:
            run(module)
            if callable(getattr(module, FUNCTION, None)):
                setattr(module, FUNCTION, _no_stub)

        spec.loader.exec_module = run_then_skip  # this spec's loader only
        return spec


def skip_stub_writer() -> bool:
    """Install the finder (once); False if Gradio's module is loaded already (too late)."""
    if MODULE in sys.modules:
        return False
    if not any(isinstance(f, _StubWriterSkipped) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubWriterSkipped())
    return True
