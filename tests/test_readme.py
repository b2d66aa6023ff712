"""The README's quick start must stay true: CI runs exactly its test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [text.strip() for text in block.splitlines() if text.strip() and not text.strip().startswith("#")]


def test_quick_start_is_two_commands_and_ci_runs_the_test_one():
    cmds = quick_start_commands()
    assert len(cmds) == 2
    demo, tests = cmds
    assert demo.endswith("gradwidget demo") and demo.startswith("pip install torch==2.13.0")
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()


def test_every_relative_link_and_image_in_the_readme_exists():
    import re

    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)\)", text)
    local = [t for t in targets if "://" not in t]
    assert "docs/panel.png" in local and "docs/report.png" in local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_the_readme_python_snippets_are_valid_python():
    import ast
    import re

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    for b in blocks:
        ast.parse(b.replace("\n...\n", "\n"))
