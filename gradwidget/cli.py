"""Command line: ``gradwidget demo | ascii RUN | export RUN | report RUN | compare RUN RUN ...``."""

from __future__ import annotations

import argparse
import sys
import unicodedata
from pathlib import Path


def _output(path: str, force: bool) -> Path:
    """The output file of a command (see ``storage.check_output_file``): an existing file is
    replaced only with ``--force``."""
    from .storage import check_output_file

    return check_output_file(path, force, force_hint="pass --force")


#: control characters kept as they are in printed text: line breaks and tabs lay it out
_LAYOUT = "\n\t"
#: Unicode's bidirectional overrides and isolates: they reorder what a terminal shows after them
_BIDI = set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))


def terminal_safe(text: str) -> str:
    """``text`` as the command line prints it: control characters (an ANSI or OSC escape sequence
    in a layer name, a carriage return, a bidirectional override) shown as Python escapes such as
    ``\\x1b``, never sent to the terminal to act on; line breaks and tabs kept."""
    return "".join(
        c
        if c in _LAYOUT or not (unicodedata.category(c) == "Cc" or ord(c) in _BIDI)
        else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def _say(text: object = "", file=None, end: str = "\n") -> None:
    """Print ``text`` made ``terminal_safe``: the one way the command line prints (names and
    messages carry what users and files wrote)."""
    print(terminal_safe(str(text)), file=file, end=end)


def _describe(e: Exception) -> str:
    """One line for an error: OSErrors say what failed on which file, without the errno prefix."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    return str(e)


def _load(path: str):
    from .storage import load_run

    return load_run(path)


def cmd_demo(args) -> int:
    from .demo import train_demo
    from .storage import check_log_dir, is_run_dir

    out = check_log_dir(args.out, overwrite=args.force, overwrite_hint="pass --force")  # before training
    if args.force and not is_run_dir(out) and out.is_dir() and any(out.iterdir()):
        # --force replaces a run; the demo never writes beside a user's other files
        raise FileExistsError(
            f"{out} holds other files and is not a gradwidget run: the demo writes only into a new or "
            f"empty folder or over a run, --force or not; pick another --out (e.g. {out / 'demo-run'})"
        )
    _say(f"gradwidget demo: a {12}-layer sigmoid MLP on synthetic data, {args.steps} steps -> {out}/")
    rec = train_demo(args.steps, log_dir=out, progress=not args.quiet, overwrite=args.force)
    run = rec.run
    from .analysis import analyze
    from .outputs import summary, to_ascii

    report = analyze(run)
    _say(to_ascii(run, width=args.width))
    _say(summary(run, report))
    _say()
    _say(report.summary_text())
    _say(f"\nRun saved in {out}/  (open it in a notebook: GradientPanel.from_run({str(out)!r}))")
    return 0


def cmd_ascii(args) -> int:
    from .outputs import to_ascii

    _say(to_ascii(_load(args.run), width=args.width), end="")
    return 0


def cmd_export(args) -> int:
    out = _output(args.output, args.force)
    run = _load(args.run)
    fmt = args.format or out.suffix.lstrip(".").lower()
    from .outputs import export_csv, export_json

    if fmt == "json":
        export_json(run, out, force=args.force)
    elif fmt == "csv":
        export_csv(run, out, force=args.force)
    else:
        _say(f"gradwidget export: unknown format {fmt!r}; use --format json or csv", file=sys.stderr)
        return 2
    _say(f"wrote {run.n_steps} steps x {run.n_layers} layers to {args.output}")
    return 0


def cmd_report(args) -> int:
    from .report import main_report

    main_report(args.run, _output(args.output, args.force), force=args.force)
    _say(f"wrote {args.output}")
    return 0


def cmd_compare(args) -> int:
    from .comparison import compare
    from .report import write_comparison

    out = _output(args.output, args.force) if args.output else None  # refused before any work
    labels = args.labels.split(",") if args.labels else None
    cmp = compare(*args.runs, labels=labels)
    _say(cmp.summary_text())
    if out is not None:
        write_comparison(cmp, out, force=args.force)
        _say(f"wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gradwidget", description="See how gradients flow while a network trains.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="train the built-in demo model and show its gradient flow")
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--out", default="gradwidget-demo-run", help="run directory to write")
    d.add_argument("--width", type=int, default=80, help="columns of the ASCII heatmap")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.add_argument("--force", action="store_true", help="replace a run already in --out")
    d.set_defaults(func=cmd_demo)
    a = sub.add_parser("ascii", help="print a run directory as an ASCII heatmap")
    a.add_argument("run")
    a.add_argument("--width", type=int, default=80)
    a.set_defaults(func=cmd_ascii)
    e = sub.add_parser("export", help="export a run directory as JSON frames or a CSV timeline")
    e.add_argument("run")
    e.add_argument("--format", choices=["json", "csv"])
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--force", action="store_true", help="replace the output file if it exists")
    e.set_defaults(func=cmd_export)
    r = sub.add_parser("report", help="write a self-contained HTML report of a run directory")
    r.add_argument("run")
    r.add_argument("-o", "--output", default="gradwidget-report.html")
    r.add_argument("--force", action="store_true", help="replace the output file if it exists")
    r.set_defaults(func=cmd_report)
    c = sub.add_parser("compare", help="compare two or more run directories (the first is the reference)")
    c.add_argument("runs", nargs="+", metavar="RUN")
    c.add_argument("--labels", help="comma-separated names for the runs (default: their paths)")
    c.add_argument("-o", "--output", help="also write a self-contained HTML comparison")
    c.add_argument("--force", action="store_true", help="replace the output file if it exists")
    c.set_defaults(func=cmd_compare)
    return p


def main(argv=None) -> int:
    from .storage import RunFormatError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RunFormatError, OSError, ValueError) as e:
        _say(f"gradwidget {args.command}: error: {_describe(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        _say(
            f"gradwidget {args.command}: error: not enough memory for this run; try a machine with more memory",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
