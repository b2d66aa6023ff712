"""The front end's own tests (vitest) and type check, run from pytest so that the README's one test
command (and CI) covers the TypeScript too. ``pip install .`` has already run ``npm install`` in js/
through hatch-jupyter-builder; without npm on the machine these skip, saying so."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parents[1] / "js"
pytestmark = pytest.mark.slow


def _npm(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the front-end tests need Node.js")
    if not (JS / "node_modules").is_dir():
        subprocess.run(
            [npm, "ci" if (JS / "package-lock.json").exists() else "install", "--no-audit", "--no-fund"],
            cwd=JS,
            check=True,
            capture_output=True,
            timeout=timeout,
        )
    return subprocess.run([npm, *args], cwd=JS, capture_output=True, text=True, timeout=timeout)


def test_vitest_suite_passes():
    p = _npm("test")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"Tests\s+(\d+) passed", re.sub(r"\x1b\[[0-9;]*m", "", out))
    assert m and int(m.group(1)) >= 30, out[-2000:]


def test_typescript_type_checks():
    p = _npm("run", "typecheck")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
