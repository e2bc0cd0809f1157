"""Executors walk a plan on a transport: host.py for CPU transports, nccl.py for GPUs."""
