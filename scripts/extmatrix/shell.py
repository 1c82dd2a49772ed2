"""An interactive shell inside a cell's environment (`repro --shell`).

The user's own startup files run first, so their aliases and tools are there; the
cell is activated after them, so that pyenv, conda or asdf lines in ~/.bashrc
cannot put another Python ahead of the cell's. bash gets an rc file that sources
~/.bashrc then activates; zsh a ZDOTDIR whose files do the same around the
user's; any other shell falls back to sh, saying so.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import canonicalize_name

from . import envs, toolchain
from .backends import Context, local
from .cells import Cell
from .errors import UserError
from .report import CellReport


def enter(cell: Cell, ctx: Context) -> int:
    """The cell's test environment when the wheel was tested (torch + the installed wheel),
    else its build environment (torch + build tools, the compiler settings exported)."""
    test_env, build_env = ctx.work / cell.id / "test-env", ctx.work / cell.id / "build-env"
    report = _report(ctx, cell)
    if (report is not None and report.test != "not-run"
            and _holds(test_env, ctx.matrix.extension.name)):
        venv, which, cwd = test_env, "test environment", ctx.work / cell.id
        exports = {}
        installed = f"torch {cell.torch_spec.split('==')[-1]} and {report.wheel}"
    elif envs.python_of(build_env).exists():
        venv, which, cwd = build_env, "build environment", ctx.work / cell.id / "src"
        tools = toolchain.provision(cell, ctx.cache)
        exports = local.compile_env(cell, tools, ctx, build_env, cwd)
        installed = f"torch {cell.torch_spec.split('==')[-1]} and the build tools"
    else:
        raise UserError(None, f"cell {cell.id} has no environment yet",
                        f"build it first: extmatrix build --cell {cell.id}")
    exports["VIRTUAL_ENV"] = str(venv)
    # PATH is rebuilt in the rc file, after the user's own startup files changed it.
    prefix = _added_to_path(exports.pop("PATH", "")) or [str(venv / "bin")]
    _say(cell, which, venv, installed, cwd, report)
    with tempfile.TemporaryDirectory(prefix=f"extmatrix-{cell.id}-") as tmp:
        cmd, env = _shell_command(Path(tmp), cell, exports, prefix)
        return subprocess.call(cmd, env=env, cwd=cwd)


def _holds(venv: Path, name: str) -> bool:
    """Whether the environment has torch and the extension installed: a test environment
    whose install failed exists all the same, empty."""
    if not envs.python_of(venv).exists():
        return False
    found = {canonicalize_name(p.name.split("-", 1)[0])
             for p in venv.glob("lib/python*/site-packages/*.dist-info")}
    return {"torch", canonicalize_name(name)} <= found


def _added_to_path(path: str) -> list[str]:
    """The folders the engine put before the inherited PATH."""
    inherited = os.environ.get("PATH", "")
    if inherited and path.endswith(inherited):
        path = path[: -len(inherited)]
    return [p for p in path.split(os.pathsep) if p]


def _report(ctx: Context, cell: Cell) -> CellReport | None:
    try:
        return CellReport.read(ctx.dist / cell.id / "report.json")
    except UserError:
        return None


def _say(cell: Cell, which: str, venv: Path, installed: str, cwd: Path,
         report: CellReport | None) -> None:
    lines = [f"# {cell.id}: entering its {which} {venv}",
             f"# installed there: {installed}", f"# working folder: {cwd}"]
    if report is not None and report.commands:
        lines.append("# what the engine ran for this cell (paste to repeat a step):")
        lines += [f"#   {c}" for c in report.commands]
    lines.append("# 'exit' returns to where you were")
    print("\n".join(lines), file=sys.stderr, flush=True)


def _activation(cell: Cell, exports: dict[str, str], prefix: list[str], prompt_var: str,
                prompt: str) -> str:
    lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(exports.items())]
    path = ":".join(shlex.quote(p) for p in prefix)
    lines += [f'export PATH={path}:"$PATH"', "hash -r 2>/dev/null",
              f"{prompt_var}={shlex.quote(f'({cell.id}) ')}{prompt}"]
    return "\n".join(lines) + "\n"


def _shell_command(tmp: Path, cell: Cell, exports: dict[str, str],
                   prefix: list[str]) -> tuple[list[str], dict[str, str]]:
    user_shell = os.environ.get("SHELL") or ""
    name = Path(user_shell).name
    env = dict(os.environ)
    if name == "bash" and shutil.which(user_shell):
        rc = tmp / "bashrc"
        rc.write_text('[ -f "$HOME/.bashrc" ] && . "$HOME/.bashrc"\n'
                      + _activation(cell, exports, prefix, "PS1", '"$PS1"'))
        return [user_shell, "--rcfile", str(rc), "-i"], env
    if name == "zsh" and shutil.which(user_shell):
        for startup in (".zshenv", ".zprofile", ".zlogin"):
            (tmp / startup).write_text(f'[ -f "$HOME/{startup}" ] && . "$HOME/{startup}"\n')
        (tmp / ".zshrc").write_text('[ -f "$HOME/.zshrc" ] && . "$HOME/.zshrc"\n'
                                    + _activation(cell, exports, prefix, "PROMPT", '"$PROMPT"'))
        env["ZDOTDIR"] = str(tmp)
        return [user_shell, "-i"], env
    sh = shutil.which("sh") or "/bin/sh"
    print(f"# {user_shell or 'no $SHELL'} is neither bash nor zsh: opening {sh}, "
          "without your shell's startup files", file=sys.stderr, flush=True)
    rc = tmp / "shrc"
    rc.write_text(_activation(cell, exports, prefix, "PS1", '"$ "'))
    env["ENV"] = str(rc)
    return [sh, "-i"], env
