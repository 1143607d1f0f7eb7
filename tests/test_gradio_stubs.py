"""Gradio's type-stub writer is skipped (reame/web/gradio_stubs.py): a component class defined
after Reame's web layer is imported writes no .pyi beside its module, as it does without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .conftest import ROOT

SUBCLASS = textwrap.dedent("""
    import gradio as gr

    class Box(gr.Textbox):
        pass
""")


def define_component(tmp_path, *, reame_first: bool) -> list[str]:
    """Define a Gradio component subclass in a fresh interpreter; the files then beside it."""
    (tmp_path / "mycomponent.py").write_text(SUBCLASS, encoding="utf-8")
    first = "import reame.web\n" if reame_first else ""
    subprocess.run([sys.executable, "-c", f"{first}import mycomponent"], check=True,
                   cwd=tmp_path, timeout=120,
                   env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "GRADIO_ANALYTICS_ENABLED": "False",
                        "PATH": "/usr/bin:/bin"})
    return sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".py", ".pyi"))


def test_no_type_stub_is_written_once_reames_web_layer_is_imported(tmp_path):
    (tmp_path / "plain").mkdir()
    assert define_component(tmp_path / "plain", reame_first=False) == [
        "mycomponent.py", "mycomponent.pyi"], "Gradio itself writes the stub (the test's premise)"
    (tmp_path / "reame").mkdir()
    assert define_component(tmp_path / "reame", reame_first=True) == ["mycomponent.py"]
