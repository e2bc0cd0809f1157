"""The benchmark suite: collectives x algorithms x sizes, checked, in nccl-tests' columns.

A package in mpi4py's bench style: functions that return records of one schema on every
backend, the timing injected per backend, reports, and a thin CLI.

- ``cases``: sizes, element types, buffers whose result is known (every result is checked).
- ``timing``: back-to-back batches after a barrier; host clocks (CPU backends) or CUDA
  events (GPUs); the ranks' coordination (the group's collectives, MPI or the store).
- ``sweep``: ``Config``, ``sweep``/``bench_rank``/``run`` returning the records (their fields
  are listed there), rounds interleaved in a rotated order, the model's columns.
- ``backends``: mpi, local, socket (torch's gloo as its baseline: ``gloo``), nccl
  (``nccl``: the GPU rows, torch's SymmetricMemory beside them: ``symmetric``).
- ``machine``: the executor that runs and ranks against cores (the header).
- ``report``: table, summary with the run's noise, JSON, CSV, plot.
- ``model``: ``--simulate P``, the cost model's table with no transport.
- ``cli``: ``main`` (``benchmarks/bench.py``, ``python -m collectives.bench``,
  ``collectives-bench``).
"""
from .cases import (ALGORITHMS, BENCH_COLLECTIVES, BUS_FACTOR, DEFAULT_SIZES, REDUCING, Case,
                    element_count, format_size, parse_dtype, parse_size, parse_sizes)
from .cli import build_parser, config_from_args, main, parse_args, run_groups, tune
from .machine import (describe_executor, host_load, missing_extension_reason,
                      oversubscription_warning, usable_cores)
from .report import (check_plotting, format_record, format_summary, header, summarize,
                     write_csv, write_json, write_plot)
from .sweep import Config, Entry, HostBench, bench_rank, on_every_group, row_barrier, run

__all__ = ["ALGORITHMS", "BENCH_COLLECTIVES", "BUS_FACTOR", "Case", "Config", "DEFAULT_SIZES",
           "Entry", "HostBench", "REDUCING", "bench_rank", "build_parser", "check_plotting",
           "config_from_args", "describe_executor", "element_count", "format_record",
           "format_size", "format_summary", "header", "host_load", "main",
           "missing_extension_reason", "on_every_group", "oversubscription_warning",
           "parse_args", "parse_dtype", "parse_size", "parse_sizes", "row_barrier", "run",
           "run_groups", "summarize", "tune", "usable_cores", "write_csv",
           "write_json", "write_plot"]
