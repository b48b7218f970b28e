"""The docs' Python snippets pass the project's own lint, as a reader's copy of them would, and
that lint stays out of a reader's own package kept in the checkout (docs/handlers.md's
`myapp/`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
RUFF = Path(sys.executable).parent / "ruff"


def snippets() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)}#{n}", block)
        for page in PAGES
        for n, block in enumerate(PYTHON_BLOCK.findall(page.read_text()))
    ]


@pytest.mark.parametrize(("where", "snippet"), snippets(), ids=[w for w, _ in snippets()])
def test_a_python_snippet_passes_the_projects_lint(where: str, snippet: str) -> None:
    # Linted as a file of a reader's package would be (`myapp/`), with the project's settings.
    result = subprocess.run(
        [str(RUFF), "check", "--no-cache", "--stdin-filename", "myapp/snippet.py", "-"],
        input=snippet,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, f"{where}:\n{snippet}\n{result.stdout}"


def test_the_projects_lint_leaves_a_package_of_the_readers_own_alone(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    unlinted = "import sys\nx = 1\nimport os  # E402, F401, I001\n"
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "billing.py").write_text(unlinted)
    ruff = [str(RUFF), "check", "--no-cache", "."]
    mine = subprocess.run(ruff, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert mine.returncode == 0, mine.stdout
    # The project's own directories still are linted.
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "bad.py").write_text(unlinted)
    ours = subprocess.run(ruff, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert ours.returncode == 1
    assert "service/bad.py" in ours.stdout
