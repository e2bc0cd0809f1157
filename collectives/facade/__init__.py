"""The bodies of the torch.distributed-shaped facade (``import collectives as dist``), which
``collectives/__init__.py`` re-exports: ``setup`` (backends, init and destroy, dying ranks),
``groups`` (ranks, new_group, subgroups), ``collectives`` (the collectives) and ``arguments``
(what they share: checks of list-shaped arguments, finishing a run)."""
