"""Command line: ``gradwidget demo | ascii RUN | export RUN | report RUN | compare RUN RUN ...``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _output(path: str, force: bool) -> Path:
    """The output file of a command (see ``storage.check_output_file``): an existing file is
    replaced only with ``--force``."""
    from .storage import check_output_file

    out = check_output_file(path)
    if not force and os.path.lexists(out):
        raise FileExistsError(f"{out} exists; pass --force to replace it, or choose another output file")
    return out


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
    from .storage import check_log_dir

    out = check_log_dir(args.out, overwrite=args.force, overwrite_hint="pass --force")  # before training
    print(f"gradwidget demo: a {12}-layer sigmoid MLP on synthetic data, {args.steps} steps -> {out}/")
    rec = train_demo(args.steps, log_dir=out, progress=not args.quiet, overwrite=args.force)
    run = rec.run
    from .analysis import analyze
    from .outputs import summary, to_ascii

    report = analyze(run)
    print(to_ascii(run, width=args.width))
    print(summary(run, report))
    print()
    print(report.summary_text())
    print(f"\nRun saved in {out}/  (open it in a notebook: GradientPanel.from_run({str(out)!r}))")
    return 0


def cmd_ascii(args) -> int:
    from .outputs import to_ascii

    print(to_ascii(_load(args.run), width=args.width), end="")
    return 0


def cmd_export(args) -> int:
    out = _output(args.output, args.force)
    run = _load(args.run)
    fmt = args.format or out.suffix.lstrip(".").lower()
    from .outputs import export_csv, export_json

    if fmt == "json":
        export_json(run, args.output)
    elif fmt == "csv":
        export_csv(run, args.output)
    else:
        print(f"gradwidget export: unknown format {fmt!r}; use --format json or csv", file=sys.stderr)
        return 2
    print(f"wrote {run.n_steps} steps x {run.n_layers} layers to {args.output}")
    return 0


def cmd_report(args) -> int:
    from .report import main_report

    main_report(args.run, _output(args.output, args.force))
    print(f"wrote {args.output}")
    return 0


def cmd_compare(args) -> int:
    from .comparison import compare
    from .report import write_comparison

    out = _output(args.output, args.force) if args.output else None  # refused before any work
    labels = args.labels.split(",") if args.labels else None
    cmp = compare(*args.runs, labels=labels)
    print(cmp.summary_text())
    if out is not None:
        write_comparison(cmp, out, force=args.force)
        print(f"wrote {args.output}")
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
        print(f"gradwidget {args.command}: error: {_describe(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            f"gradwidget {args.command}: error: not enough memory for this run; try a machine with more memory",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
