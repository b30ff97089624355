"""The events of a kernel's accesses as numpy rows (a point's indices, then loop values), and
what the dataflow rules ask of them: rows numbered as integers, the order events run in, an init
that runs after an update of its point, a step added twice with no init between
(schedlang.checker.dataflow lists the rows; this module only reads them)."""

from __future__ import annotations

import math

import numpy as np


def numbered(*groups: np.ndarray) -> list[np.ndarray] | None:
    """Each row of each group (of as many columns) as one integer, row-major over the box around
    them all, so equal rows get equal numbers across groups; None if the box is too wide to number
    in 63 bits."""
    filled = [g for g in groups if len(g)]
    if not filled:
        return [np.zeros(0, dtype=np.int64) for _ in groups]
    # Column by column, each contiguous: ten times faster than reducing rows across (n, d).
    columns = [np.ascontiguousarray(g.T) for g in groups]
    low = np.min([c.min(axis=1) for c in columns if c.shape[1]], axis=0)
    span = np.max([c.max(axis=1) for c in columns if c.shape[1]], axis=0) - low + 1
    if math.prod(int(x) for x in span) >= 2**62:
        return None
    numbers = []
    for column in columns:
        flat = np.zeros(column.shape[1], dtype=np.int64)
        for d in range(column.shape[0]):
            flat *= int(span[d])
            flat += column[d] - low[d]
        numbers.append(flat)
    return numbers


def late_point(points: np.ndarray) -> np.ndarray | None:
    """Of an update's points (its indices, then whether the init runs there, in the order the
    loops run them), one whose first update comes without its init, or None."""
    if not len(points):
        return None
    rows, starts = points[:, :-1], points[:, -1]
    if not rows.shape[1]:
        return None
    numbers = numbered(rows)
    if numbers is not None:
        _, first = np.unique(numbers[0], return_index=True)
    else:  # too wide a box to number its points: compare them as rows
        _, first = np.unique(rows, axis=0, return_index=True)
    late = first[starts[first] == 0]
    return rows[late[0]] if len(late) else None


def event_order(
    first: np.ndarray, then: np.ndarray, rank: int, count: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The execution order of the init's events (rows of `first`) and the update's (`then`):
    the `count` shared loops' values after the `rank` index columns, then the init's nest before
    the update's, then each nest's own order. Returns (rows, stage, position)."""
    rows = np.concatenate([first[:, : rank + count], then[:, : rank + count]])
    stage = np.concatenate([np.zeros(len(first), np.int64), np.ones(len(then), np.int64)])
    sequence = np.concatenate([np.arange(len(first)), np.arange(len(then))])
    shared = rows[:, rank:]
    keys = [sequence, stage, *(shared[:, n] for n in reversed(range(count)))]
    position = np.empty(len(rows), np.int64)
    position[np.lexsort(keys)] = np.arange(len(rows))  # lexsort: its last key first
    return rows, stage, position


def step_again(
    first: np.ndarray, then: np.ndarray, rank: int, alive: list[int], count: int
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The first point to which the update adds one step (the same points of its other inputs)
    twice with no init between: a loop above the update that comes back to the point runs the
    whole reduction again."""
    rows, stage, position = event_order(first, then, rank, count)
    points = np.concatenate([rows[:, :rank], rows[:, rank:][:, alive]], axis=1)
    numbers = numbered(points)
    if numbers is None:
        return None
    _, ids = np.unique(numbers[0], return_inverse=True)
    # Each event's epoch: how many inits of its point ran before it.
    order = np.lexsort((position, ids))
    inits = (stage[order] == 0).astype(np.int64)
    running = np.cumsum(inits)
    starts = np.r_[0, np.flatnonzero(np.diff(ids[order])) + 1]
    group = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    before = np.where(group > 0, running[group - 1], 0)
    epoch = np.empty(len(rows), np.int64)
    epoch[order] = running - before
    updates = np.flatnonzero(stage == 1)
    key = np.concatenate(
        [ids[updates, None], epoch[updates, None], then[:, rank + count :]], axis=1
    )
    numbers = numbered(key)
    if numbers is None:
        return None
    _, where, counts = np.unique(numbers[0], return_index=True, return_counts=True)
    twice = where[counts > 1]
    if not len(twice):
        return None
    row = updates[twice[0]]
    return tuple(int(v) for v in rows[row, :rank]), tuple(int(v) for v in rows[row, rank:])


def init_after_update(
    first: np.ndarray, then: np.ndarray, rank: int, alive: list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The first point (and the shared loops' values there) whose init (rows of `first`: the
    point, then the shared loops' values) runs after an update of it (rows of `then`); a point
    is told apart by the shared loops numbered in `alive` too (its buffer's lifetime)."""
    rows, stage, position = event_order(first, then, rank, first.shape[1] - rank)
    shared = rows[:, rank:]
    points = np.concatenate([rows[:, :rank], shared[:, alive]], axis=1)
    numbers = numbered(points)
    if numbers is None:
        return None
    _, ids = np.unique(numbers[0], return_inverse=True)
    last_init = np.full(ids.max() + 1, -1, np.int64)
    np.maximum.at(last_init, ids[stage == 0], position[stage == 0])
    first_update = np.full(ids.max() + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_update, ids[stage == 1], position[stage == 1])
    late = np.flatnonzero((last_init > first_update) & (first_update < np.iinfo(np.int64).max))
    if not len(late):
        return None
    row = np.flatnonzero((ids == late[0]) & (stage == 0) & (position == last_init[late[0]]))[0]
    return tuple(int(v) for v in points[row][:rank]), tuple(int(v) for v in shared[row])


def in_sample(rows: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """Which rows (points) are one of `sample`'s."""
    numbers = numbered(sample, rows)
    if numbers is None:  # too wide a box to number: compared as rows
        wanted = set(map(tuple, sample.tolist()))
        return np.array([tuple(r) in wanted for r in rows.tolist()], dtype=bool)
    return np.isin(numbers[1], numbers[0])
