"""Product text describes what the software does now. Development history (sessions, issue numbers,
"this machine", "this morning", dated measurement logs, a design document outside the repository)
belongs in git and CHANGELOG.md, not in the README, the documentation, the bench READMEs, or the
docstrings, comments and messages of the package, the benchmarks and the tests. Each failure names
the file and line."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: what reads as development history, case-insensitive
PROCESS_WORDS = re.compile(
    r"|".join(
        [
            r"\bsessions?\s+\d+",  # "session 22", "sessions 12-14"
            r"\b(?:this|that|another|each|every|other)\s+sessions?\b",
            r"\bissues?\s+#?\d+",  # "issue 22", "issue #7"
            r"\bthis\s+machine\b",
            r"\b(?:this|yesterday)\s+morning\b",
            r"\byesterday\b",
            r"\btoday'?s?\b",
            r"\b20\d\d-\d\d-\d\d\b",  # a dated log entry
            r"(?<![-\w])s\d{2}(?!\w)",  # "s11", "s12-cost": a session's short name
            r"\bDESIGN\.md\b",
        ]
    ),
    re.IGNORECASE,
)

#: in the package's prose, a timing is a measurement log that rots: the costs page holds the figures
#: with the command that reproduces them (a message's own timing is formatted, not a literal)
CODE_TIMINGS = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|µs)\b")


def text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "examples" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "bench").rglob("README.md"))
    return [f for f in files if f.is_file() and ".zoo-cache" not in f.parts]


def code_files() -> list[Path]:
    return sorted((ROOT / "gradwidget").rglob("*.py")) + sorted((ROOT / "docs").rglob("*.py"))


def bench_and_test_files() -> list[Path]:
    """The benchmarks and the tests, less this file (its patterns name the words)."""
    files = sorted((ROOT / "bench").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))
    return [f for f in files if f.resolve() != Path(__file__).resolve() and ".zoo-cache" not in f.parts]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The comments and string literals (docstrings, messages) of a Python file, line by line."""
    out = []
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    for tok in tokens:
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            for i, line in enumerate(tok.string.splitlines()):
                out.append((tok.start[0] + i, line))
    return out


def offences(path: Path, lines, *patterns: re.Pattern) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for n, line in lines:
        for pattern in (PROCESS_WORDS, *patterns):
            m = pattern.search(line)
            if m:
                out.append(f"{rel}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}")
                break
    return out


def code_offences(path: Path) -> list[str]:
    return offences(path, prose_lines(path), CODE_TIMINGS)


def bench_and_test_offences(path: Path) -> list[str]:
    """The process words only: a benchmark's timing literal is a target or a printed format
    ("target < 16 ms"), a test's sets the scale of a fixture ("a 150 ms collection"); neither is a
    measurement log. A bench's measured figures live on the costs page, not in its docstring."""
    return offences(path, prose_lines(path))


def test_the_words_are_caught():
    for text in [
        "Session 24",
        "as before issue 23",
        "on this machine",
        "the same command this morning",
        "since s12",
        "merged from s11-cost",
        "measured 2026-11-28",
        "see DESIGN.md",
        "today's build",
    ]:
        assert PROCESS_WORDS.search(text), text
    assert CODE_TIMINGS.search("one pass: 0.34 -> 0.13 ms on the bench model")
    for text in [
        "gpt2-adamw-s0-lr_too_high",
        "a Jupyter kernel",
        "pytorch#104336",
        "the original crate",
        "one step in 8",
        "rnn-sgd-s1-exploding",
    ]:
        assert not PROCESS_WORDS.search(text), text


def test_readme_docs_and_bench_readmes_carry_no_history():
    bad = []
    for path in text_files():
        bad += offences(path, enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
    assert not bad, "development history in product text (move it to CHANGELOG.md or drop it):\n" + "\n".join(bad)


def test_the_package_comments_and_docstrings_carry_no_history():
    bad = []
    for path in code_files():
        bad += code_offences(path)
    assert not bad, "development history in the package's comments or docstrings:\n" + "\n".join(bad)


def test_the_bench_and_test_comments_and_docstrings_carry_no_history():
    files = bench_and_test_files()
    assert any(f.parts[-2] == "bench" for f in files) and any(f.name == "conftest.py" for f in files)
    bad = []
    for path in files:
        bad += bench_and_test_offences(path)
    assert not bad, "development history in bench/ or tests/ comments or docstrings:\n" + "\n".join(bad)
