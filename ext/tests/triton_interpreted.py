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

import numpy  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import segment_ops  # noqa: E402, F401  (the installed one, its op and library)
from segment_ops import _triton  # noqa: E402

# Triton 3.6's interpreter gives one-element arrays where range() needs a
# scalar, which numpy 2 no longer converts with int() (3.7 squeezes them
# itself): this can go once no cell tests with triton 3.6.
_patch_tensor = interpreter._patch_lang_tensor


def _scalar_index(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


interpreter._patch_lang_tensor = _scalar_index

# Triton 3.9's interpreter types a comparison by its operands (int32 for two
# int32 scalars), so a scalar comparison splatted into a tile's mask becomes
# int32, which its load rejects ("mask has unsupported dtype"); compiled, the
# same comparison is int1. Results that are booleans are typed int1 here.
_binary_op = interpreter.InterpreterBuilder.binary_op


def _compare_as_int1(self, lhs, rhs, op):
    result = _binary_op(self, lhs, rhs, op)
    if result.data.dtype == numpy.bool_ and result.dtype != tl.int1:
        return interpreter.TensorHandle(result.data, tl.int1)
    return result


interpreter.InterpreterBuilder.binary_op = _compare_as_int1


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


FAMILIES = ("lanes", "wide", "blocks")
SHAPES = {tuner: tuner.configs for family in FAMILIES for tuner in tuners(family)}


def run(family: str, fields: dict, dtype_name: str, inner: int, law: str, rows: int) -> dict:
    """One case: the worst segment's error over what its dtype allows (at
    most 1 passes), or why the case could not run."""
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(rows + inner)
    indptr = torch.tensor([0, *torch.tensor(lengths(law, rows, gen)).cumsum(0).tolist()])
    # fp32 sums are held to the sum of |x| (they add in another order than the
    # reference), so a mean of 1 makes a part lost or scaled show against it;
    # bf16 results round, to within an ulp of the sum (2^-7 of it: the
    # interpreter truncates; two are allowed), so a mean of 0 keeps sums small
    # and a lost row shows.
    mean = 1.0 if dtype == torch.float32 else 0.0
    src = (torch.randn(rows, inner, generator=gen) + mean).to(dtype)
    out = torch.full((indptr.numel() - 1, inner), float("nan"), dtype=dtype)
    # One config per tuner of the family (a tuner of one config runs it,
    # untimed, unpruned); every other tuner back to its own.
    for tuner, shapes in SHAPES.items():
        tuner.configs, tuner.best_config = shapes, None
    picked = [t for t in tuners(family) if _narrow(t, fields)]
    if not picked:
        return {"error": f"no {family} config has {fields}"}
    try:
        _triton._launch(src, indptr, out)
    except Exception as err:  # e.g. another family's tuner, timing under the interpreter
        return {"error": f"{type(err).__name__}: {err}"[:500]}
    if not any(t.best_config is not None for t in picked):
        return {"error": f"the launch took no {family} kernel"}
    ref = torch.segment_reduce(src.double(), "sum", offsets=indptr, axis=0)
    magnitude = torch.segment_reduce(src.double().abs(), "sum", offsets=indptr, axis=0) + 1
    allowed = 2e-6 * magnitude + (2**-6 * ref.abs() if dtype == torch.bfloat16 else 0)
    ratio = ((out.double() - ref).abs() / allowed).nan_to_num(nan=float("inf"))
    return {
        "unwritten": int(out.isnan().sum()),
        "worst": float(ratio.max()),
        "worst_segment": int(ratio.max(1).values.argmax()),
    }


def _narrow(tuner, fields: dict) -> bool:
    """Leave the tuner the first of its configs with these values, if any."""
    matches = [c for c in SHAPES[tuner] if all(c.kwargs.get(k) == v for k, v in fields.items())]
    tuner.configs = matches[:1] or tuner.configs
    return bool(matches)


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps([run(*case) for case in cases]))
