"""Runs segment_ops' Triton forward under Triton's interpreter on the CPU, one
tile shape per case, and prints each case's worst error as JSON. A script of
its own (test_triton_interpreter.py runs it): TRITON_INTERPRET must be set
before triton is first imported, or triton's own jit helpers stay compiled
functions that the interpreter cannot call.

    python triton_interpreted.py CASES_JSON   # [[family, fields, dtype, inner, law, rows], ...]
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import segment_ops  # noqa: E402, F401  (the installed one, its op and library)
from segment_ops import _triton  # noqa: E402

# The interpreter's reductions give one-element arrays where range() needs a
# scalar, which numpy 2 no longer converts with int().
_patch_tensor = interpreter._patch_lang_tensor


def _scalar_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _scalar_index


def lengths(law: str, rows: int, gen: torch.Generator) -> list[int]:
    """Seeded segment lengths summing to `rows`; `mixed` has empty segments
    and, every 16th, one of 300 rows (the rest path, chunk crossings)."""
    out: list[int] = []
    while sum(out) < rows:
        if law == "short":
            out.append(int(torch.randint(1, 17, (1,), generator=gen)))
        elif law == "long":
            out.append(int(torch.randint(512, 1537, (1,), generator=gen)))
        elif law == "power":
            out.append(int((1 - torch.rand(1, generator=gen).item()) ** (-1 / 1.1)))
        elif law == "giant":
            out.append(rows - 40 if not out else 4)
        else:
            out.append(
                300 if len(out) % 16 == 15 else int(torch.randint(0, 40, (1,), generator=gen))
            )
    out[-1] -= sum(out) - rows
    return out


def tuners(family: str):
    if family == "lanes":
        return list(_triton._LANE_KERNELS.values())
    if family == "wide":
        return list(_triton._WIDE_LANE_KERNELS.values())
    return list(_triton._KERNELS.values())


SHAPES = {id(t): t.configs for family in ("lanes", "wide", "blocks") for t in tuners(family)}


def run(family: str, fields: dict, dtype_name: str, inner: int, law: str, rows: int) -> dict:
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(rows + inner)
    indptr = torch.tensor([0, *torch.tensor(lengths(law, rows, gen)).cumsum(0).tolist()])
    # A mean of 1: a sum's error is then small against the sum itself, so a
    # part lost or scaled shows even on long segments.
    src = (torch.randn(rows, inner, generator=gen) + 1).to(dtype)
    out = torch.full((indptr.numel() - 1, inner), float("nan"), dtype=dtype)
    # One config per tuner: a tuner of one config runs it, untimed, unpruned.
    picked = 0
    for tuner in tuners(family):
        config = next(
            (c for c in SHAPES[id(tuner)] if all(c.kwargs.get(k) == v for k, v in fields.items())),
            None,
        )
        tuner.configs = SHAPES[id(tuner)] if config is None else [config]
        picked += config is not None
    if not picked:
        return {"error": f"no {family} config has {fields}"}
    _triton._launch(src, indptr, out)
    ref = torch.segment_reduce(src.double(), "sum", offsets=indptr, axis=0)
    scale = torch.segment_reduce(src.double().abs(), "sum", offsets=indptr, axis=0) + 1
    err = ((out.double() - ref).abs() / scale).nan_to_num(nan=float("inf"))
    return {
        "unwritten": int(out.isnan().sum()),
        "worst": float(err.max()),
        "worst_segment": int(err.max(1).values.argmax()),
    }


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps([run(*case) for case in cases]))
