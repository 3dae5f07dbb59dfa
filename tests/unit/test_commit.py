"""The survivors' commit after a regroup (`runtime.quorum.agree`): from every survivor's
record of its live collectives — how many it took; round, size and sums of those under
way; round, size, checksum and ranks of the last taken — the rounds some completed and the
others did not are handed over by one that kept the sum, the rounds none completed are
summed again with a total to check, and survivors out of step in a way that cannot be
mended fail, saying why, the error naming every rank lost (`Quorum.named`, over a real
store)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from stalebench.errors import RunError
from stalebench.runtime.quorum import (
    Handover,
    Live,
    Quorum,
    Rounds,
    RoundsFailed,
    _checksum,
    _shape,
    _sums,
    agree,
    mark_dead,
)

F32 = "torch.float32"


def under_way(round_: int, buf: torch.Tensor) -> list:
    return [round_, *_shape(buf), *_sums(buf)]


def kept(round_: int, buf: torch.Tensor, members: list[int], joining=()) -> list:
    return [round_, *_shape(buf), _checksum(buf), members, [list(p) for p in joining]]


def test_survivors_in_step_sum_again_with_the_total_to_check():
    bufs = {r: torch.randn(1000) for r in (0, 2, 3)}
    records = {r: {"taken": 7, "live": [under_way(7, b)], "kept": []} for r, b in bufs.items()}
    handed, expect = agree(records)
    assert handed == []
    total, bound = expect[7]
    assert total == pytest.approx(sum(float(b.double().sum()) for b in bufs.values()))
    assert 0 < bound < 1e-3 * sum(float(b.abs().sum()) for b in bufs.values())


def test_a_round_one_survivor_completed_is_handed_to_the_others():
    # rank 2 completed round 7 (the lost rank's data had reached it) and started round 8;
    # ranks 0 and 3 have round 7 under way: rank 2 hands its sum over, over the four
    # ranks it had; round 8 is under way at rank 2 only, so no total is checked for it
    summed, nxt = torch.randn(1000), torch.randn(1000)
    mine = {r: torch.randn(1000) for r in (0, 3)}
    records = {
        0: {"taken": 7, "live": [under_way(7, mine[0])], "kept": []},
        2: {"taken": 8, "live": [under_way(8, nxt)], "kept": [kept(7, summed, [0, 1, 2, 3])]},
        3: {"taken": 7, "live": [under_way(7, mine[3])], "kept": []},
    }
    handed, expect = agree(records)
    assert handed == [Handover(7, 2, 1000, F32, _checksum(summed), [0, 1, 2, 3], [])]
    assert expect == {}


def test_pipelined_rounds_hand_over_what_was_taken_and_sum_again_the_rest():
    # two collectives per exchange (statistics float64, payload float32), both under way:
    # rank 0 took both of round pair 10/11; rank 1 took 10 only
    stats, payload, ranks = torch.randn(4, 9, dtype=torch.float64), torch.randn(500), [0, 1, 2]
    records = {
        0: {"taken": 12, "live": [], "kept": [kept(10, stats, ranks), kept(11, payload, ranks)]},
        1: {
            "taken": 11,
            "live": [under_way(11, torch.randn(500))],
            "kept": [kept(10, stats, ranks)],
        },
    }
    handed, _ = agree(records)
    assert [(h.round, h.source, h.numel, h.dtype) for h in handed] == [(11, 0, 500, F32)]


@pytest.mark.parametrize(
    ("records", "why"),
    [
        (  # the survivor that completed round 7 no longer keeps it
            {0: {"taken": 7, "live": [under_way(7, torch.ones(4))], "kept": []},
             2: {"taken": 9, "live": [], "kept": [kept(8, torch.ones(4), [0, 2])]}},
            "round 7 was completed by ranks [2], none of which kept it",
        ),
        (  # the round completed by one is, at another, a buffer of another size
            {0: {"taken": 7, "live": [under_way(7, torch.ones(5))], "kept": []},
             2: {"taken": 8, "live": [], "kept": [kept(7, torch.ones(4), [0, 1, 2])]}},
            "rank 0 has no round 7 of 4 torch.float32 under way",
        ),
        (  # rounds under way with sizes that differ: gloo would abort on them
            {0: {"taken": 7, "live": [under_way(7, torch.ones(5))], "kept": []},
             2: {"taken": 7, "live": [under_way(7, torch.ones(4))], "kept": []}},
            "round 7 under way with sizes [[5, 'torch.float32'], [4, 'torch.float32']]",
        ),
        (  # spares were to join after a round only one survivor completed
            {0: {"taken": 7, "live": [under_way(7, torch.ones(4))], "kept": []},
             2: {"taken": 8, "live": [], "kept": [kept(7, torch.ones(4), [0, 1, 2], [(4, 1)])]}},
            "spares were chosen in round 7, which only some completed",
        ),
    ],
    ids=["not-kept", "sizes-of-a-completed-round", "sizes-under-way", "spares"],
)  # fmt: skip
def test_survivors_that_cannot_agree_fail_saying_why(records, why):
    with pytest.raises(RunError) as failed:
        agree(records)
    assert why in str(failed.value)


def test_the_total_tells_a_round_summed_out_of_step():
    # float32 sums in any order stay within the bound; a buffer of another round (the
    # same size, which gloo's size check cannot see) does not
    torch.manual_seed(0)
    rounds = [[torch.randn(1 << 20) * 1e-3 for _ in range(3)] for _ in range(2)]
    records = {r: {"taken": 5, "live": [under_way(5, rounds[0][r])], "kept": []} for r in range(3)}
    _, expect = agree(records)
    total, bound = expect[5]
    for order in ([0, 1, 2], [2, 0, 1]):
        got = rounds[0][order[0]] + rounds[0][order[1]] + rounds[0][order[2]]
        assert abs(float(got.double().sum()) - total) <= bound
    mixed = rounds[0][0] + rounds[0][1] + rounds[1][2]
    assert abs(float(mixed.double().sum()) - total) > bound


def test_a_failure_names_every_rank_lost():
    # those left out at earlier regroups, and members marked dead by the supervisor since;
    # `left` tells the program which replicas to log lost (runtime.members.Members.failed)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    quorum = Quorum(store, 0, 4, 5.0, 4)
    quorum.lost, quorum.members = [1], [0, 2, 3]
    mark_dead(store, 2)
    failed = quorum.named("ranks [0, 2, 3] cannot agree on their rounds")
    assert str(failed) == "ranks [0, 2, 3] cannot agree on their rounds (lost: ranks 1, 2)"
    assert isinstance(failed, RoundsFailed) and failed.left == [0, 3]


@pytest.mark.timeout(60)
def test_a_handed_over_round_takes_the_shape_of_the_buffer_under_way():
    # Rounds.commit over a real gloo group (two ranks in threads): rank 0 completed round 3
    # of a 2-D buffer (a fragment stack), rank 1 has it under way; rank 1 takes rank 0's
    # sum in its own buffer's shape (it comes over the wire flat)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    summed = torch.randn(4, 6)
    quorums = [Quorum(store if r == 0 else store.clone(), r, 2, 20.0, 2) for r in (0, 1)]
    rounds = [Rounds(q, None, begin=None) for q in quorums]
    done = Live(summed.clone(), summed.clone(), None, None, 3, members=[0, 1, 2])
    rounds[0].taken, rounds[0].started = [done], 4
    mine = torch.randn(4, 6)
    rounds[1].live, rounds[1].started = [Live(mine, mine.clone(), None, None, 3)], 4
    errors: list[BaseException] = []

    def commit(r: int) -> None:
        try:
            quorums[r].epoch = 1
            quorums[r].group = quorums[r]._group(1, [0, 1])
            rounds[r].commit()
        except BaseException as exc:  # said by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=commit, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert rounds[1].live == [] and torch.equal(mine, summed)
    assert [x.round for x in rounds[1].taken] == [3] and rounds[1].taken[0].members == [0, 1, 2]
