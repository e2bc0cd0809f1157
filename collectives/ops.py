"""ReduceOp, with torch.distributed's member names and integer values."""
import enum


class ReduceOp(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9

    @classmethod
    def parse(cls, op) -> "ReduceOp":
        """Accept a ReduceOp, its integer value, its name in any case, or a torch ReduceOp."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            try:
                return cls[op.upper()]
            except KeyError:
                pass
        elif isinstance(op, int):
            try:
                return cls(op)
            except ValueError:
                pass
        else:  # torch.distributed.ReduceOp / RedOpType: match by name, no torch import here
            name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
            if name.upper() in cls.__members__:
                return cls[name.upper()]
        raise ValueError(f"unknown reduce op {op!r}; known: {', '.join(cls.__members__)}")


# Every collective a plan can be built for. Append only: a collective's index is part of the
# call signature that travels with every message (collectives.signature).
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
               "reduce", "gather", "scatter", "barrier")

# The collectives that take a reduction op (the others only move data).
REDUCING = frozenset({"all_reduce", "reduce_scatter", "reduce"})

# torch refuses these on complex tensors (it reduces complex as pairs of reals, where they
# would give wrong answers silently); so does the facade, with torch's words. PRODUCT is the
# exception: torch refuses it too, but our reductions multiply complex numbers as complex
# numbers, so the facade computes it (a documented difference).
COMPLEX_REFUSED = frozenset({ReduceOp.MAX, ReduceOp.MIN, ReduceOp.BAND, ReduceOp.BOR,
                             ReduceOp.BXOR})


def check_complex(op, dtype, operation: str, rank: int) -> None:
    """Raise torch's ValueError if ``op`` is one torch refuses on a complex ``dtype``."""
    if getattr(dtype, "kind", None) != "c":
        return
    parsed = ReduceOp.parse(op)
    if parsed in COMPLEX_REFUSED:
        raise ValueError(f"{operation} on rank {rank}: all_reduce does not support "
                         f"ReduceOp.{parsed.name} on complex tensors")
