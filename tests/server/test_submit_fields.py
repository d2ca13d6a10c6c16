"""Issue 12 items 1, 4 and 5 at the service: which priority class a submission gets, who may pick
which, and what the core's Workload carries of the class and the time limit."""

from __future__ import annotations

import pytest

from gpupool.api.workloads import WorkloadSpec
from gpupool.config import PoolConfig, PriorityClassConfig, parse_config
from gpupool.core.priority import PriorityClasses
from gpupool.errors import PriorityNotAllowed, UnknownName
from gpupool.server.services.specs import default_priority_class, priority_class, to_workload


def _classes(*pairs: tuple[str, int]) -> list[PriorityClassConfig]:
    return [PriorityClassConfig(name=n, value=v) for n, v in pairs]


@pytest.mark.parametrize(("classes", "default"), [
    (PoolConfig().priority_classes, "normal"),
    (_classes(("low", 0), ("high", 1000)), "low"),  # the example file
    (_classes(("high", 100), ("mid", 10), ("low", -5)), "mid"),  # the lowest non-negative
    (_classes(("worse", -50), ("bad", -10)), "bad"),  # all negative: the highest
    (_classes(("normal", 500), ("low", 0)), "normal"),  # a class named normal wins
    ([], None),
])
def test_the_default_class(classes: list[PriorityClassConfig], default: str | None) -> None:
    assert default_priority_class(classes) == default


def test_a_tenant_may_pick_a_class_up_to_its_max_priority() -> None:
    config = PoolConfig()
    assert priority_class(config, "best-effort", "team-a", 0) == "best-effort"
    assert priority_class(config, "normal", "team-a", 0) == "normal"
    assert priority_class(config, "high", "team-a", 100) == "high"
    with pytest.raises(PriorityNotAllowed, match="may not use priority class high") as refused:
        priority_class(config, "high", "team-a", 99)
    assert refused.value.http_status == 403
    assert priority_class(config, "critical", "default", None) == "critical"  # the admin


def test_the_default_class_is_never_refused() -> None:
    config = parse_config("priority_classes:\n  - {name: batch, value: 50}\n")
    assert priority_class(config, None, "team-a", 0) == "batch"


def test_an_unknown_class_lists_the_classes() -> None:
    with pytest.raises(UnknownName) as refused:
        priority_class(PoolConfig(), "hihg", "team-a", 0)
    assert refused.value.message == ("Unknown priority class 'hihg'; choose one of critical, high, normal, "
                                     "best-effort (`gpupool config show` lists them). Did you mean 'high'?")
    assert refused.value.http_status == 422
    with pytest.raises(UnknownName, match="this pool defines none"):
        priority_class(parse_config("priority_classes: []\n"), "high", "team-a", None)


def test_the_core_workload_ranks_by_class_and_plans_with_the_time_limit() -> None:
    spec = WorkloadSpec.model_validate({"command": ["x"], "priority": 7, "priority_class": "high",
                                        "time_limit_s": 3600, "runtime_estimate_s": 60})
    workload = to_workload("w-1", spec, "t", spec.priority, 0.0)
    assert workload.priority_class == "high" and workload.runtime_estimate_s == 3600
    assert PriorityClasses().rank(workload) == (100, 7)
    plain = to_workload("w-2", WorkloadSpec.model_validate({"command": ["x"], "runtime_estimate_s": 60}),
                        "t", 0, 0.0)
    assert plain.runtime_estimate_s == 60
