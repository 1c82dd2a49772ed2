"""`extmatrix`: the command line. Each subcommand mirrors a nox session."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from . import report, run, schema
from .cells import Cell, Plan, plan_file
from .errors import Interrupted, NotBuildable, UserError, describe_os_error

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def _default_matrix() -> str:
    return os.environ.get("EXTMATRIX_MATRIX", "matrix.yaml")


def _selection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", default=_default_matrix(),
                        help="matrix file (default: matrix.yaml, or $EXTMATRIX_MATRIX)")
    parser.add_argument("--subset", help="a named subset from the matrix file (e.g. pr, local)")
    parser.add_argument("--cell", action="append", default=[], metavar="ID",
                        help="one cell by id; repeat for several")
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="GLOB",
                        help="cells whose id matches GLOB, e.g. 'torch2.1*-cu13*'")


def selected(args: argparse.Namespace, default_subset: str | None = None
             ) -> tuple[Plan, list[Cell]]:
    plan = plan_file(args.matrix)
    subset = args.subset
    everything = False
    if subset is None and not args.cell and not args.patterns and default_subset:
        subset = default_subset if default_subset in plan.matrix.subsets else None
        everything = subset is None
    cells = plan.select(subset, args.cell, args.patterns)
    # Every cell may mean every CUDA torch (GBs each): say so, and how to ask for less, once
    # the rest of the command line has been checked (_note), so that a mistake stays one line.
    args.note = (f"# {args.matrix} has no '{default_subset}' subset: all {len(cells)} cells "
                 f"selected; narrow with --subset, --cell or -k, or add a '{default_subset}' "
                 "subset to the matrix") if everything else None
    return plan, cells


def _note(args: argparse.Namespace) -> None:
    if getattr(args, "note", None):
        print(args.note, file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse, with its complaints on one line (and still exit status 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} cells at a time; give 1 or more")
    return value


BACKEND_HELP = ("local: a virtual environment per cell; container: cibuildwheel in the "
                "flavor's image")


def _run_args(parser: argparse.ArgumentParser, backend_help: str = BACKEND_HELP) -> None:
    _selection_args(parser)
    parser.add_argument("--backend", choices=run.BACKENDS, default="local", help=backend_help)
    parser.add_argument("-j", "--jobs", type=_positive, default=1, help="cells at a time")
    parser.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                        help="a cell that cannot be built here fails the run (default: on "
                        "when $CI is set, or when cells are named with --cell or -k)")
    parser.add_argument("--dist", help="results folder (default: dist/ beside the matrix)")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop starting cells after the first failure")


def _complete(args: argparse.Namespace) -> bool:
    """Whether every Python a wheel serves must have been tested: asked (--strict) or CI,
    not merely a named cell (a laptop reproducing one has the Pythons it has)."""
    if getattr(args, "strict", None) is not None:
        return args.strict
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def _strict(args: argparse.Namespace) -> bool:
    """Whether a cell that cannot be built here fails the run: also where cells are named."""
    return _complete(args) or (args.strict is None and bool(args.cell or args.patterns))


def _build(args: argparse.Namespace) -> int:
    plan, cells = selected(args, default_subset="local")
    console = run.console()
    ctx = run.context(plan, dist=args.dist, parallel=args.jobs, rebuild=args.rebuild,
                      console=console)
    _note(args)
    reports = run.build(cells, ctx, args.backend, args.jobs, not args.fail_fast, console)
    return run.finish(reports, args.backend, console, _strict(args), _complete(args))


def _test_matrix(args: argparse.Namespace) -> int:
    plan, cells = selected(args, default_subset="local")
    console = run.console()
    ctx = run.context(plan, dist=args.dist, parallel=args.jobs, require_gpu=args.require_gpu,
                      console=console)
    _note(args)
    reports = run.test(cells, ctx, args.backend, args.jobs, not args.fail_fast, console,
                       known=plan.cells)
    return run.finish(reports, args.backend, console, _strict(args), _complete(args))


def _repro(args: argparse.Namespace) -> int:
    args.cell, args.subset, args.patterns = [args.cell_id], None, []
    plan, (cell,) = selected(args)
    console = run.console()
    ctx = run.context(plan, dist=args.dist, parallel=1, require_gpu=args.require_gpu,
                      echo=sys.stdout, rebuild=True, console=console)
    reports = run.build([cell], ctx, args.backend, 1, True, console)
    if reports[0].build == "built":
        reports = run.test([cell], ctx, args.backend, 1, True, console, known=plan.cells)
    status = run.finish(reports, args.backend, console, strict=True, complete=_complete(args))
    if not args.shell:
        return status
    try:
        code = run.shell(cell, ctx, args.backend)
    except UserError as exc:
        if status == 0:
            raise
        # The run above just failed to make an environment: no mistake of the user's, and
        # building again (the usual advice) would fail the same way.
        print(f"extmatrix: no shell: {exc.problem}", file=sys.stderr)
        return status
    # The cell's result, not the shell's last command, is what the status reports.
    return status or code


def _images(args: argparse.Namespace) -> int:
    from . import images

    plan, cells = selected(args, default_subset="local")
    if args.print_bake:
        # The bake file CI builds (upstream bases) unless --base local: then only the images
        # a local base can make, as `images --base local` builds them (any platform).
        base = args.base if args.base in images.BASES else "upstream"
        wanted = [i for i in images.needed(cells, base, plan.matrix.images.prefix)
                  if images.skip_reason(i, base, i.platform) is None]
        _note(args)
        sys.stdout.write(images.bake_json(
            wanted, images.context_of(Path(plan.source.file).resolve().parent)))
        return 0
    ctx = run.context(plan, dist=None, parallel=1, writes_results=False)
    _note(args)
    return images.build(ctx, cells, args.engine, args.base)


def _plan(args: argparse.Namespace) -> int:
    from . import workflow

    # Options that would be ignored silently: the user expected them to do something.
    if args.check and not args.outdated:
        raise UserError("--check", "only applies with --outdated", "pass --outdated --check")
    if args.outdated and (args.json or args.explain):
        raise UserError("--outdated", f"prints a patch, not {'JSON' if args.json else 'a table'}",
                        f"drop {'--json' if args.json else '--explain'}, or run it separately")
    if args.job != "cells" and not args.json:
        raise UserError(f"--for {args.job}", "chooses the JSON of a workflow job",
                        f"pass --json --for {args.job}")
    plan, cells = selected(args)
    if args.outdated:
        return _outdated(plan, args.check)
    if args.json:
        sys.stdout.write(report.matrix_json(workflow.matrix(cells, args.job)))
    else:
        # Piped or in a CI log, rich would wrap cell ids at 80 columns: run.console widens.
        report.print_plan(cells, plan.dropped if args.explain else None,
                          run.console(stderr=False))
    return 0


def _index(args: argparse.Namespace) -> int:
    from . import index

    plan, cells = selected(args)
    root = Path(plan.source.file).resolve().parent
    dist = Path(args.dist).resolve() if args.dist else root / "dist"
    out = Path(args.output).resolve() if args.output else dist / "index"
    pages, left_out = index.build(dist, cells, out, args.base_url)
    for why in left_out:
        print(f"left out {why}", file=sys.stderr)
    for page in pages:
        print(f"wrote {page}", file=sys.stderr)
    if left_out and _strict(args):
        # A release that publishes fewer wheels than it built must not pass as complete.
        print(f"{len(left_out)} left out, and --strict publishes all or fails (the lines "
              "above say why each was)", file=sys.stderr)
        return 1
    return 0


def _init(args: argparse.Namespace) -> int:
    from . import init

    written = init.write(Path(args.path), Path(args.output), torch=args.torch,
                         pythons=args.python, engine_spec=args.engine_spec,
                         with_workflow=not args.no_workflow,
                         force=args.force, import_name=args.import_name)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"next: extmatrix plan --matrix {args.output}, then extmatrix build --matrix "
          f"{args.output}", file=sys.stderr)
    return 0


def _facts(args: argparse.Namespace) -> int:
    from . import compat, facts
    from . import source as yaml_source
    from .config import validate

    path = Path(args.compat) if args.compat else compat.BUILTIN
    compat.Compat.load(path)  # a mistake in the file: its one line, before any index is read
    new_text, diff, notes = facts.refresh(path)
    for note in notes:
        print(f"# {note}", file=sys.stderr)
    if not diff:
        # Not "agrees": what no index answered for stays as written, unchecked.
        unchecked = (f"; {len(notes)} note(s) above say what could not be checked and stays "
                     "as written" if notes else "")
        print(f"{path}: no change from the indexes that answered{unchecked}", file=sys.stderr)
        return 0
    sys.stdout.write(diff)
    if args.write:
        # The refreshed facts must load before they replace the old ones.
        validate(yaml_source.parse(new_text, str(path)), compat.CompatFile)
        path.write_text(new_text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print("# review the diff, then run again with --write", file=sys.stderr)
    return 0


def _outdated(plan: Plan, check: bool) -> int:
    import datetime

    from . import outdated
    from .project import requires_python

    ext_dir = Path(plan.source.file).parent / plan.matrix.extension.path
    found = outdated.changes(plan, datetime.date.today(), requires_python(ext_dir)[0])
    if not found:
        print(f"{plan.source.file}: up to date with the compatibility facts", file=sys.stderr)
        return 0
    for change in found:
        print(f"# {change}")
    for axis in outdated.emptied(plan, found):
        print(f"# axes.{axis} stays as it is: the changes would leave it empty, and a matrix "
              "needs one")
    if any(c.action == "add" and c.axis == "flavor" for c in found):
        print("# a new GPU flavor also needs its archs under 'flavors:' (they are never guessed)")
    diff = outdated.patch(plan, found)
    if diff and (why := outdated.refused(plan, diff)):
        print(f"# applied as it is, the patch makes a matrix that is refused: {why}; adjust "
              "the matrix's rules with it")
    sys.stdout.write(diff)
    return 1 if check else 0


def _schema(args: argparse.Namespace) -> int:
    text = schema.render()
    target = Path(args.output)
    if args.check:
        if target.is_dir():
            raise UserError(str(target), "is a folder", "pass --output the schema file")
        try:
            stale = target.read_bytes() != text.encode()
        except OSError:
            stale = True
        if stale:
            raise UserError(str(target), "the JSON Schema is stale",
                            "run 'extmatrix schema' to regenerate it")
        return 0
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as exc:  # where the user pointed --output: their mistake to fix
        raise UserError(f"--output {target}", f"cannot be written: {exc.strerror or exc}",
                        "name a file in a folder that exists and is writable") from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="extmatrix",
        description="Build and test a PyTorch extension across a matrix of torch versions "
        "and CPU/CUDA/ROCm flavors.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("plan", help="show the cells the matrix expands to")
    _selection_args(p)
    p.add_argument("--json", action="store_true",
                   help='print the GitHub Actions form {"include": [...]} on stdout')
    p.add_argument("--for", dest="job", choices=("cells", "gpu", "cross"), default="cells",
                   help="with --json: the matrix of that workflow job (gpu: cells with a "
                   "gpu_runner; cross: a pair of cells of different torch releases)")
    p.add_argument("--outdated", action="store_true",
                   help="what the matrix should add (new torch, flavors, Pythons) or drop, as a "
                   "patch to the matrix file")
    p.add_argument("--check", action="store_true", help="with --outdated: exit 1 if outdated")
    p.add_argument("--explain", action="store_true",
                   help="also list every dropped combination with its reason")
    _COMMANDS["plan"] = _plan

    p = sub.add_parser("build", help="build the wheels of the selected cells (default: subset "
                       "local) into dist/<cell>/")
    _run_args(p)
    p.add_argument("--rebuild", action="store_true",
                   help="compile even when a cell's sources, torch and settings are unchanged")
    _COMMANDS["build"] = _build

    p = sub.add_parser("test-matrix", help="install each built wheel beside its torch in a fresh "
                       "environment and run the extension's tests")
    _run_args(p, "the backend the cells were built with, for the repro lines; the tests run "
                 "as users install the wheel, in a virtual environment, either way")
    p.add_argument("--require-gpu", action="store_true",
                   help="GPU tests fail instead of skipping when no GPU is visible")
    _COMMANDS["test-matrix"] = _test_matrix

    p = sub.add_parser("repro", help="rebuild and retest one cell, printing every command")
    p.add_argument("cell_id", metavar="CELL")
    p.add_argument("--matrix", default=_default_matrix(),
                   help="matrix file (default: matrix.yaml, or $EXTMATRIX_MATRIX)")
    p.add_argument("--backend", choices=run.BACKENDS, default="local", help=BACKEND_HELP)
    p.add_argument("--dist", help="results folder (default: dist/ beside the matrix)")
    p.add_argument("--require-gpu", action="store_true",
                   help="GPU tests fail instead of skipping when no GPU is visible")
    p.add_argument("--shell", action="store_true",
                   help="then leave me in the cell's environment")
    _COMMANDS["repro"] = _repro

    p = sub.add_parser("images", help="build the container images the selected cells need "
                       "(default: subset local), printing each command")
    _selection_args(p)
    p.add_argument("--engine", choices=("docker", "podman"),
                   help="docker (buildx bake, needs a running daemon) or podman; default: "
                   "$EXTMATRIX_ENGINE, else docker when usable, else podman")
    p.add_argument("--base", choices=("upstream", "local"),
                   help="upstream: the matrix's base images; local: a Debian-made base, no "
                   "registry needed; default: upstream when their registries answer")
    p.add_argument("--print-bake", action="store_true",
                   help="print the docker buildx bake file (JSON) instead of building: on "
                   "the upstream bases unless --base local, with no registry probed")
    _COMMANDS["images"] = _images

    p = sub.add_parser("index", help="publish the good wheels as a find-links page and a "
                       "PEP 503 simple index per torch build (torch-2.14.1+cu130.html)")
    _selection_args(p)
    p.add_argument("--dist", help="results folder (default: dist/ beside the matrix)")
    p.add_argument("--output", help="index folder (default: DIST/index)")
    p.add_argument("--base-url", help="where the index will be served; default: relative links")
    p.add_argument("--strict", action=argparse.BooleanOptionalAction, default=None,
                   help="exit 1 when a selected cell or torch build is left out (default: on "
                   "when $CI is set, or when cells are named with --cell or -k)")
    _COMMANDS["index"] = _index

    p = sub.add_parser("facts", help="the compatibility facts: 'refresh' reads PyPI and "
                       "PyTorch's indexes and prints how the facts file should change")
    p.add_argument("action", choices=("refresh",))
    p.add_argument("--compat", help="facts file (default: the built-in one)")
    p.add_argument("--write", action="store_true", help="write the refreshed file")
    _COMMANDS["facts"] = _facts

    p = sub.add_parser("init", help="write a first matrix.yaml (and a GitHub Actions workflow) "
                       "for an existing extension")
    p.add_argument("path", nargs="?", default=".", help="the extension's project folder")
    p.add_argument("--output", default="matrix.yaml", help="the matrix file to write")
    p.add_argument("--torch", help="torch release (X.Y) to start with; default: the newest")
    p.add_argument("--python", action="append", metavar="3.X",
                   help="a Python to build for; repeat; default: every Python the torch "
                   "ships for that is alive and the project accepts")
    p.add_argument("--import", dest="import_name", metavar="NAME",
                   help="the module the tests import (the matrix's extension.import); default: "
                   "the package the project's extension modules live in")
    p.add_argument("--engine-spec",
                   help="what the workflow pip-installs to get the engine, e.g. "
                   "'extmatrix @ git+https://github.com/OWNER/extmatrix@TAG'; default: the "
                   "git+https:// URL and commit this engine was installed from (installed "
                   "otherwise: required, or --no-workflow)")
    p.add_argument("--no-workflow", action="store_true", help="write only the matrix")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    _COMMANDS["init"] = _init

    p = sub.add_parser("schema", help="write the JSON Schema of matrix.yaml for editors")
    p.add_argument("--output", default="matrix.schema.json")
    p.add_argument("--check", action="store_true", help="fail if the file on disk is stale")
    _COMMANDS["schema"] = _schema
    return parser


def main(argv: list[str] | None = None) -> int:
    previous = _stop_on_signals()
    try:
        args = build_parser().parse_args(argv)  # (Ctrl-C this early: the one line too)
        with report.repro_options(_named_matrix(args), getattr(args, "dist", None),
                                  getattr(args, "require_gpu", False)):
            status = _COMMANDS[args.command](args)
            sys.stdout.flush()  # a reader gone (`| head`) shows here, not at exit
            return status
    except UserError as exc:
        print(f"extmatrix: {exc}" if exc.where is None else str(exc), file=sys.stderr)
        return 2
    except NotBuildable as exc:
        print(f"extmatrix: not buildable here: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"extmatrix: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("extmatrix: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `extmatrix plan | head`: the reader has what it wanted. Quiet, as a tool killed
        # by SIGPIPE is; stdout is pointed at /dev/null so the exit's flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        print(f"extmatrix: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, the rest in a file
        print(f"extmatrix: internal error: {type(exc).__name__}: {exc}; {run.crash_log(exc)}",
              file=sys.stderr)
        return 70
    finally:
        for kind, handler in previous.items():
            signal.signal(kind, handler)


def _named_matrix(args: argparse.Namespace) -> str | None:
    """The --matrix a printed command must repeat: none for the one found without it."""
    given = getattr(args, "matrix", None)
    if given is None or Path(given).resolve() == Path(_default_matrix()).resolve():
        return None
    return given


def _stop_on_signals() -> dict:
    """SIGTERM (a CI cancel, `kill`) and SIGHUP (the terminal or ssh session gone) end a
    run like Ctrl-C: commands stopped, attempts recorded, wheels kept. The previous
    handlers, to put back."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = {}
    try:
        for kind in run.STOP_SIGNALS:
            previous[kind] = signal.signal(kind, handler)
    except ValueError:  # not the main thread (an embedding program): leave signals alone
        pass
    return previous


if __name__ == "__main__":
    sys.exit(main())
