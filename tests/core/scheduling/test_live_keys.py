"""After a preemption the cycle's live keys (`_Cycle.live`) are brought back from the keys settled
since and trimmed of the bands passed over (`_revive`) instead of made afresh from every key: the
same set every time, so the same decisions."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from bench_loop import assert_same_cycles, config_loop

from gpupool.core.scheduling import cycle


def _afresh(c: cycle._Cycle) -> set[object]:
    """`live` as it was made afresh after each preemption."""
    return {k for k, n in c.left.items() if n and k[0] not in c.blocked and k not in c.never}


@pytest.mark.parametrize(("config", "unsettled", "zeroed"),
                         [("default", 0, 1), ("bench/configs/full.yaml", 5, 3)])
def test_live_after_a_preemption_is_the_set_made_afresh(config: str, unsettled: int, zeroed: int) -> None:
    """Every revival gives the set made afresh; under `full.yaml` (queues with quotas) some brought
    settled keys back, and some dropped the keys of a band passed over; every decision and the rng
    equal those with `live` made afresh."""
    seen = {"revived": 0, "unsettled": 0, "zeroed": 0}
    original = cycle._Cycle._revive

    def checked(self: cycle._Cycle) -> None:
        seen["revived"] += 1
        seen["unsettled"] += bool(self.unsettled)
        seen["zeroed"] += bool(self.zeroed)
        original(self)
        assert self.live == _afresh(self)
        assert not self.unsettled and not self.zeroed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle._Cycle, "_revive", checked)
        revived = config_loop(config)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cycle, "incremental_live", False)
        afresh = config_loop(config)
    assert seen["revived"] >= 5, seen
    assert seen["unsettled"] >= unsettled and seen["zeroed"] >= zeroed, seen
    assert_same_cycles(revived, afresh)
    assert sum(len(r.preempted) for r, _ in revived) > 0


def test_revive_against_the_set_made_afresh_under_every_step() -> None:
    """The walk's steps as `_Cycle` takes them on its keys (reach one, settle, never fits, block a
    queue, pass a band over), in a seeded random order: after each preemption's `_revive`, `live`
    is the set made afresh, queues blocked, keys that never fit and bands passed over included."""
    rng = random.Random(5)
    for _ in range(200):
        keys = [(f"q{q}", f"s{s}", (band, 0)) for q in range(3) for s in range(3) for band in range(2)]
        c = SimpleNamespace(left={k: rng.randint(1, 3) for k in keys}, blocked=set(), never={},
                            unsettled=[], zeroed=[])
        c.live = set(c.left)
        for _ in range(30):
            step, key = rng.randrange(6), rng.choice(keys)
            if step == 0 and c.left[key]:  # reached (`_reached`)
                c.left[key] -= 1
                if not c.left[key]:
                    c.live.discard(key)
            elif step == 1 and key in c.live:  # settled (`_consider`)
                c.live.discard(key)
                c.unsettled.append(key)
            elif step == 2:  # never fits
                c.never[key] = ("why", "not")
                c.live.discard(key)
            elif step == 3:  # its queue blocked (`_block`)
                c.blocked.add(key[0])
                c.live = {k for k in c.live if k[0] != key[0]}
            elif step == 4:  # its band passed over (`_reject_reached`)
                for k in c.left:
                    if k[2][0] == key[2][0]:
                        c.left[k] = 0
                        c.zeroed.append(k)
            else:  # a preemption
                cycle._Cycle._revive(c)  # type: ignore[arg-type]
                assert c.live == _afresh(c)  # type: ignore[arg-type]
