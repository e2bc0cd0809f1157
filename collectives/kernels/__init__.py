"""Leaf kernels: reductions and copies. Compiled versions (Numba/Cython) live beside pure
numpy twins that the tests hold them against."""
