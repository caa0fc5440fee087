"""The Colab demo runs headless on CPU (nbclient) in its short smoke form."""

import os

import pytest

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(__file__)), "notebooks", "quickstart.ipynb")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_quickstart_notebook_executes(monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  monkeypatch.setenv("SAO_NOTEBOOK_SHORT", "1")
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # the kernel uses one CPU device
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(nb, timeout=900, kernel_name="python3").execute(
    cwd=os.path.dirname(NOTEBOOK)
  )
  out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
  assert "backend: cpu" in out
  assert "eval pass@1 after RL" in out
