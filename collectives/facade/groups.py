"""Groups: ranks and their translation, new_group and the subgroup splits."""
from __future__ import annotations

import hashlib
import os

from .. import state
from ..errors import CollectiveError, CollectiveTimeout
from ..group import ProcessGroup
from ..state import GroupMember, seconds as _seconds


def get_rank(group=None) -> int:
    """This process's rank in ``group``.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default group.

    Returns:
        int: the group rank, or -1 on a rank outside ``group``.
    """
    pg = state.resolve(group, "get_rank")
    return -1 if pg is None else pg.rank


def get_world_size(group=None) -> int:
    """The number of ranks in ``group``.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default group.

    Returns:
        int: the size, or -1 on a rank outside ``group``.
    """
    pg = state.resolve(group, "get_world_size")
    return -1 if pg is None else pg.size


def get_process_group_ranks(group) -> list[int]:
    """The global ranks of ``group``, in group-rank order.

    Args:
        group (ProcessGroup): a group this rank is a member of.

    Returns:
        list[int]: the global rank of each group rank.
    """
    pg = state.resolve(group, "get_process_group_ranks")
    if pg is None:
        raise ValueError("get_process_group_ranks: this rank is not a member of the group")
    return list(pg.ranks)


def get_global_rank(group, group_rank: int) -> int:
    """Translate a group rank of ``group`` into a global rank.

    Args:
        group (ProcessGroup): a group this rank is a member of.
        group_rank (int): a rank of ``group``.

    Returns:
        int: the global rank.
    """
    ranks = get_process_group_ranks(group)
    if not isinstance(group_rank, int) or not 0 <= group_rank < len(ranks):
        raise ValueError(f"get_global_rank: group rank {group_rank!r} is not in the group "
                         f"(size {len(ranks)})")
    return ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    """Translate a global rank into its rank in ``group``.

    Args:
        group (ProcessGroup): a group this rank is a member of.
        global_rank (int): a global rank that is part of ``group``.

    Returns:
        int: the group rank.
    """
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"get_group_rank: global rank {global_rank!r} is not part of the "
                         f"group (ranks {ranks})")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None):
    """Make a subgroup of the default group. Every rank of the job calls it, members or
    not, in the same order and with the same ranks: checked by one small all_gather on the
    default group, so ranks that differ all raise CollectiveError naming what each made.

    Args:
        ranks (list[int], optional): global ranks of the subgroup; None: every rank.
        timeout (float or timedelta, optional): the subgroup's timeout (inf: no deadline;
            NaN or negative: ValueError); None: the default group's.
        group_desc (str, optional): the subgroup's name in messages.
        backend, pg_options, use_local_synchronization: accepted for torch's signature.

    Returns:
        ProcessGroup, or GroupMember.NON_GROUP_MEMBER on a rank outside ``ranks``.
    """
    world = state.world()
    size = world.default.size
    # checked on members and non-members alike, before the group id is taken
    limit = world.timeout if timeout is None else \
        _seconds(timeout, f"new_group on rank {world.default.rank}")
    ranks = list(range(size)) if ranks is None else sorted(int(r) for r in ranks)
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(f"new_group on rank {world.default.rank}: Rank {r} is out of "
                             f"range: ranks {ranks} must be distinct ranks within "
                             f"0..{size - 1}")
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group on rank {world.default.rank}: ranks {ranks} must be "
                         f"distinct ranks within 0..{size - 1}")
    group_id = world.next_group_id
    world.next_group_id += 1
    _agree_on_group(world, group_id, ranks)
    if world.default.rank not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    transport = _subgroup_transport(world.transport, ranks, group_id)
    pg = ProcessGroup(transport, backend=world.backend, timeout=limit, group_id=group_id,
                      ranks=ranks, name=group_desc or f"group{group_id}")
    world.groups.append(pg)
    return pg


# A group as every rank of the job names it at new_group: its creation number (its id: what
# keeps its messages apart from every other group's) and its ranks. The label shows it in a
# message; the digest, of the whole text, is what is compared.
_GROUP_DIGEST_BYTES = 16
_GROUP_LABEL_BYTES = 240


def _agree_on_group(world, group_id, ranks) -> None:
    """Check that every rank of the job, members or not, makes the same group at this call:
    groups made in another order, or with other ranks, on some ranks would pair one group's
    messages with another's (or wait for ranks that never come). One small all_gather on the
    default group, before the subgroup exists and before its decision tables are compared
    (which would otherwise be blamed)."""
    default = world.default
    if default.size == 1:
        return
    text = f"group {group_id} of ranks {ranks}"
    label = text.encode()
    if len(label) > _GROUP_LABEL_BYTES:
        label = label[:_GROUP_LABEL_BYTES - 4] + b" ..."
    record = (hashlib.sha256(text.encode()).digest()[:_GROUP_DIGEST_BYTES]
              + label.ljust(_GROUP_LABEL_BYTES, b"\0"))
    try:
        records = default.gather_records(record)
    except CollectiveTimeout as exc:
        raise CollectiveTimeout(
            f"new_group on rank {default.rank}: not every rank of the job made {text} (every "
            f"rank must call new_group for every group, members or not, in the same order): "
            f"{exc}") from exc
    seen: dict[bytes, list[int]] = {}
    labels = {}
    for r, every in enumerate(records):
        digest = every[:_GROUP_DIGEST_BYTES]
        seen.setdefault(digest, []).append(r)
        labels.setdefault(digest, every[_GROUP_DIGEST_BYTES:].rstrip(b"\0").decode(
            errors="replace"))
    if len(seen) > 1:
        parts = [f"ranks {members} make {labels[digest]}" for digest, members in seen.items()]
        raise CollectiveError(
            f"new_group on rank {default.rank}: the ranks make different groups at this call "
            f"(the job's new_group number {group_id}): " + "; ".join(parts) + ". Every rank "
            f"of the job must call new_group (and new_subgroups) for every group, members or "
            f"not, in the same order and with the same ranks")


def _subgroup_transport(parent, ranks, group_id):
    from ..transports.subgroup import SubgroupTransport
    make = getattr(parent, "subgroup", None)
    return make(ranks) if make is not None else SubgroupTransport(parent, ranks, group_id)


def new_subgroups(group_size=None, group=None, timeout=None, backend=None, pg_options=None,
                  group_desc=None):
    """Split ``group``'s ranks into consecutive subgroups of ``group_size`` ranks.

    Every rank of the world calls it, as for new_group; a rank outside ``group`` cannot
    know its ranks, so it gets a ValueError (in torch it fails too).

    Args:
        group_size (int, optional): ranks per subgroup; must divide the size of ``group``; None:
            the launcher's LOCAL_WORLD_SIZE, else the size of ``group``.
        group (ProcessGroup, optional): the group to split; None is the default group.
        timeout, backend, pg_options, group_desc: as for new_group.

    Returns:
        (this rank's subgroup, every subgroup in order).
    """
    pg = state.resolve(group, "new_subgroups")
    if pg is None:
        raise ValueError(f"new_subgroups on rank {get_rank()}: this rank is not a member of "
                         f"the group to split; only its members know its ranks")
    ranks = list(pg.ranks)
    if group_size is None:
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE", len(ranks)))
    if group_size <= 0 or len(ranks) % group_size:
        raise ValueError(f"new_subgroups on rank {get_rank()}: group_size {group_size} must be "
                         f"positive and divide the group's size {len(ranks)}")
    return new_subgroups_by_enumeration(
        [ranks[start:start + group_size] for start in range(0, len(ranks), group_size)],
        timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None,
                                 pg_options=None, group_desc=None):
    """Make one subgroup per list of global ranks.

    Every rank of the world calls it with the same lists. Checked whole before any
    subgroup is made, so a bad list is the same ValueError on every rank.

    Args:
        ranks_per_subgroup_list (list[list[int]]): disjoint lists of global ranks; they need not
            cover the world.
        timeout, backend, pg_options, group_desc: as for new_group.

    Returns:
        (this rank's subgroup, or None if it is in none; every subgroup in order, with
            GroupMember.NON_GROUP_MEMBER for those this rank is not in).
    """
    world = state.world()
    me, size = world.default.rank, world.default.size
    if not ranks_per_subgroup_list:
        raise ValueError(f"new_subgroups_by_enumeration on rank {me}: The arg "
                         f"'ranks_per_subgroup_list' cannot be empty")
    seen = {}
    for ranks in ranks_per_subgroup_list:
        for r in ranks:
            if not 0 <= int(r) < size:
                raise ValueError(f"new_subgroups_by_enumeration on rank {me}: Rank {r} is "
                                 f"out of range of the world size {size}")
            if r in seen:
                raise ValueError(f"new_subgroups_by_enumeration on rank {me}: Rank {r} has "
                                 f"appeared in both subgroup {seen[r]} and {list(ranks)}")
            seen[r] = list(ranks)
    subgroups, mine = [], None
    for ranks in ranks_per_subgroup_list:
        pg = new_group(list(ranks), timeout=timeout, backend=backend, pg_options=pg_options,
                       group_desc=group_desc)
        subgroups.append(pg)
        if pg is not GroupMember.NON_GROUP_MEMBER:
            mine = pg
    return mine, subgroups
