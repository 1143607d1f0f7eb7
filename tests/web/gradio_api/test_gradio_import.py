"""Gradio's import made lighter (reame/web/gradio_api/gradio_import.py): a component class
defined after Reame's web layer is imported writes no .pyi beside its module, as it does
without it; a server that answered events never loaded pandas or matplotlib."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

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


@pytest.mark.slow
def test_no_type_stub_is_written_once_reames_web_layer_is_imported(tmp_path):
    (tmp_path / "plain").mkdir()
    assert define_component(tmp_path / "plain", reame_first=False) == [
        "mycomponent.py", "mycomponent.pyi"], "Gradio itself writes the stub (the test's premise)"
    (tmp_path / "reame").mkdir()
    assert define_component(tmp_path / "reame", reame_first=True) == ["mycomponent.py"]


def test_a_server_that_answered_gradio_events_never_loaded_pandas_or_matplotlib(page_server):
    """Gradio imports pandas at start, and after every queued event built a DataFrame of its
    last 10,000 events (for its /monitoring page): pandas now loads only when used, and the
    queue's summary is off (reame/web/http/queue_polling.py), so it never is. Gradio imported
    matplotlib at the first API call, for a backend switch around every call: that switch
    now does nothing (reame/web/gradio_api/gradio_import.py)."""
    from tests.gradio_api import ApiClient

    client = ApiClient(page_server.url)
    chat = client.predict("pandas check", None, api_name="/new_chat")
    assert client.predict(api_name="/list_chats") and chat
    maps = Path(f"/proc/{page_server.process.pid}/maps").read_text()
    assert "pandas" not in maps, "the server loaded pandas"
    assert "matplotlib" not in maps, "the server loaded matplotlib"


@pytest.mark.slow
def test_the_web_layer_imports_without_the_mcp_sdk_and_leaves_it_whole_for_others():
    """Gradio's MCP server class imported the `mcp` SDK at Gradio's import (0.4 s of every
    start) for an MCP server Reame never runs: the web layer now imports without it. A process
    that imported `mcp` first (the OpenAI Agents SDK does) keeps it, and Gradio's class has it."""
    check = textwrap.dedent("""
        import sys
        {first}
        import reame.web.server
        import gradio.mcp
        print("mcp" in sys.modules, hasattr(gradio.mcp.GradioMCPServer, "Server"))
    """)
    answers = []
    for first in ("", "import mcp"):
        run = subprocess.run([sys.executable, "-c", check.format(first=first)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             env={"PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False",
                                  "PATH": "/usr/bin:/bin"})
        assert run.returncode == 0, run.stderr[-2000:]
        answers.append(run.stdout.split())
    assert answers == [["False", "False"], ["True", "True"]]
