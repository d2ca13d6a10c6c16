"""The replay's communication model: seeded model classes and a gang's step time on its placement.

Each job draws a model class (image / language / speech, seeded; default 30 / 60 / 10 %). A class
has a communication-to-compute ratio `comm_ratio` (the all-reduce's bandwidth term over the compute
time of one step, packed inside one leaf, for a large ring), an overlap exponent `overlap` (g) and
a gradient size. On a placement over p nodes a step takes, as in Pollux and Sia,

    T = (T_comp^g + T_net^g)^(1/g),   T_net = ring all-reduce over p ranks (alpha-beta,
                                               core/fabric/collective.py) at bandwidth B,

where B is the gang's bottleneck bandwidth: its share of each link pool it crosses (a node's HCA
links, a leaf's uplinks, a spine group's uplinks, shared by the gangs on them: `FabricView`),
times an efficiency per tier crossed (static ECMP hashing and congestion control get a flow only
part of a cross-leaf path; the assumption that makes even a 1:1 fabric cost something). The job's
slowdown is T over the same step packed inside one leaf on idle links (1.0 there); it progresses
at 1/slowdown. The default classes are calibrated so that a gang spread over two leaves of an
idle 1:1 fabric is 1.10-1.67x slower than packed (the range the Blox and Synergy simulators use),
for every gang size: see `spread_slowdown` and docs/experiments/network-aware.md ("The communication model").

Reading the trace: a trace duration is the job's work at its original placement. `origin=packed`
takes it as the packed time; `origin=two-leaves` assumes each multi-node job originally ran spread
over two leaves of a 1:1 fabric and divides by that slowdown (Philly records no racks; the copy of
the trace in the shared data directory also drops the machine lists, see `Origin`). Only jobs that
passed are slowed: a failed or killed job keeps its wall time (`JobComm.passed`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpupool.core.fabric.collective import DEFAULT_BASE_ALPHA_S, ring_allreduce_s
from gpupool.core.fabric.model import DEFAULT_CABLE_LATENCY_NS, DEFAULT_SWITCH_LATENCY_NS
from gpupool.errors import InvalidInput

MIB = 1024 * 1024


class ModelClass(StrEnum):
    IMAGE = "image"
    LANGUAGE = "language"
    SPEECH = "speech"


COMM_HEAVY = ModelClass.LANGUAGE
"""The class the benchmarks' "communication-heavy share" sets."""


class Origin(StrEnum):
    """Where the trace's durations were measured.

    packed: every job ran packed (its duration is its work).
    two-leaves: every multi-node job ran spread over two leaves of a 1:1 fabric (its duration is its
    work times that slowdown). Philly's full trace lists each attempt's machines but not their
    racks; the Sia cut in the shared data directory lists neither, so this is an assumption about
    the machine-to-leaf mapping: the original machines of a multi-node job straddled one leaf
    boundary. The two bound the truth from both sides for a trace with no rack data.
    """

    PACKED = "packed"
    TWO_LEAVES = "two-leaves"


class ClassSpec(BaseModel):
    """One model class: its share of jobs and how it communicates."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    share: float = Field(ge=0.0, le=1.0)
    comm_ratio: float = Field(gt=0.0, description="bandwidth term / compute per step, packed, large ring")
    overlap: float = Field(ge=1.0, description="Pollux/Sia overlap exponent g (1 = no overlap)")
    gradient_mib: float = Field(gt=0.0, description="bytes all-reduced per step")


DEFAULT_CLASSES: dict[ModelClass, ClassSpec] = {
    # ResNet-like: small gradients against a long compute step, overlapped well.
    ModelClass.IMAGE: ClassSpec(share=0.30, comm_ratio=0.6, overlap=2.0, gradient_mib=100.0),
    # Transformer LMs: large gradients, little overlap left after the backward pass.
    ModelClass.LANGUAGE: ClassSpec(share=0.60, comm_ratio=1.5, overlap=1.2, gradient_mib=1300.0),
    # DeepSpeech-like RNNs: in between.
    ModelClass.SPEECH: ClassSpec(share=0.10, comm_ratio=0.8, overlap=1.5, gradient_mib=200.0),
}


class CommModel(BaseModel):
    """The `--comm-model` file (YAML or JSON); `default_comm_model()` is the calibrated default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    classes: dict[ModelClass, ClassSpec] = Field(default_factory=lambda: dict(DEFAULT_CLASSES))
    cross_leaf_efficiency: float = Field(default=0.5, gt=0.0, le=1.0)
    cross_spine_efficiency: float = Field(default=0.45, gt=0.0, le=1.0)
    base_alpha_s: float = Field(default=DEFAULT_BASE_ALPHA_S, ge=0.0)
    origin: Origin = Origin.PACKED

    @model_validator(mode="after")
    def _shares(self) -> CommModel:
        total = sum(c.share for c in self.classes.values())
        if not self.classes or abs(total - 1.0) > 1e-6:
            raise ValueError(f"the classes' shares must add up to 1, they add up to {total:g}")
        return self

    def with_comm_heavy(self, share: float) -> CommModel:
        """The same classes with `share` of jobs communication-heavy, the others keeping their ratio."""
        if not 0.0 <= share <= 1.0:
            raise InvalidInput(f"The communication-heavy share must be within 0..1, got {share}.")
        rest = {k: c for k, c in self.classes.items() if k is not COMM_HEAVY}
        rest_total = sum(c.share for c in rest.values()) or 1.0
        classes = {k: c.model_copy(update={"share": (1.0 - share) * c.share / rest_total})
                   for k, c in rest.items()}
        heavy = self.classes.get(COMM_HEAVY, DEFAULT_CLASSES[COMM_HEAVY])
        classes[COMM_HEAVY] = heavy.model_copy(update={"share": share})
        return self.model_copy(update={"classes": classes})


def default_comm_model() -> CommModel:
    return CommModel()


def load_comm_model(spec: str) -> CommModel:
    """`default` or the path of a YAML/JSON file; one-sentence InvalidInput otherwise."""
    if spec == "default":
        return default_comm_model()
    path = Path(spec)
    if not path.is_file():
        raise InvalidInput(f"Communication model file {spec} does not exist; give a YAML file or 'default'.")
    import yaml
    from pydantic import ValidationError

    from gpupool.yamlfiles import read_text, safe_load

    try:
        data = safe_load(read_text(path, "the communication model")) or {}
        return CommModel.model_validate(data)
    except yaml.YAMLError as exc:  # its text ends with a caret under the column: say the problem
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InvalidInput(f"{spec}{where} is not valid YAML ({getattr(exc, 'problem', None) or exc}).") \
            from None
    except ValidationError as exc:
        first = str(exc).splitlines()
        detail = first[-1].strip() if first else "unreadable"
        raise InvalidInput(f"{spec} is not a valid communication model ({detail}); see "
                           "docs/experiments/network-aware.md (The communication model) "
                           "for the fields.") from None


# ---------------------------------------------------------------------------------- step time

PATH_SWITCHES = {0: 1, 1: 3, 2: 5}
"""Switches on a path inside one leaf (0), across leaves of one spine group (1), across groups (2)."""


def path_latency_ns(tier: int) -> float:
    switches = PATH_SWITCHES[tier]
    return switches * DEFAULT_SWITCH_LATENCY_NS + (switches + 1) * DEFAULT_CABLE_LATENCY_NS


def step_time_s(
    spec: ClassSpec, ranks: int, bandwidth_gbps: float, ref_gbps: float, latency_ns: float,
    base_alpha_s: float = DEFAULT_BASE_ALPHA_S,
) -> float:
    """One step's time on `ranks` nodes whose bottleneck is `bandwidth_gbps` (T_comp from the class's
    ratio at `ref_gbps`, the packed bandwidth)."""
    message = spec.gradient_mib * MIB
    compute = (2.0 * message * 8.0 / (ref_gbps * 1e9)) / spec.comm_ratio
    if ranks <= 1:
        return compute
    if bandwidth_gbps <= 0:
        return math.inf
    net = ring_allreduce_s(ranks, message, base_alpha_s + latency_ns * 1e-9, 8.0 / (bandwidth_gbps * 1e9))
    g = spec.overlap
    return float((compute**g + net**g) ** (1.0 / g))


def slowdown(
    spec: ClassSpec, ranks: int, bandwidth_gbps: float, ref_gbps: float, tier: int,
    base_alpha_s: float = DEFAULT_BASE_ALPHA_S,
) -> float:
    """Step time on the placement over the same step packed in one leaf on idle links (>= 1)."""
    if ranks <= 1:
        return 1.0
    packed = step_time_s(spec, ranks, ref_gbps, ref_gbps, path_latency_ns(0), base_alpha_s)
    here = step_time_s(spec, ranks, bandwidth_gbps, ref_gbps, path_latency_ns(tier), base_alpha_s)
    return max(1.0, here / packed)


def spread_slowdown(model: CommModel, klass: ModelClass, ranks: int, ref_gbps: float = 200.0) -> float:
    """The calibration point: `ranks` nodes spread over two leaves of an idle 1:1 fabric."""
    spec = model.classes[klass]
    return slowdown(spec, ranks, ref_gbps * model.cross_leaf_efficiency, ref_gbps, 1, model.base_alpha_s)


# ---------------------------------------------------------------------------------- per job


class EstimateMode(StrEnum):
    """What the scheduler is told about a job's communication (never the replay's truth itself)."""

    EXACT = "exact"
    HOPS_ONLY = "hops-only"
    NOISY = "noisy"


@dataclass(frozen=True, slots=True)
class JobComm:
    """A job's class and how its trace duration is read."""

    klass: ModelClass
    spec: ClassSpec
    origin_slowdown: float = 1.0
    passed: bool = True
    estimate_ratio: float | None = None
    """The ratio the scheduler is told (None: it knows hop counts only)."""


def assign_classes(
    jobs: Iterable[tuple[str, int, bool]],
    model: CommModel,
    seed: int,
    estimate: EstimateMode = EstimateMode.EXACT,
    error: float = 0.5,
    ref_gbps: float = 200.0,
) -> dict[str, JobComm]:
    """(workload id, nodes it spans packed, passed) -> its JobComm, seeded by `seed` and job order.

    With `EstimateMode.NOISY` the scheduler's ratio is the truth times 1 +/- `error` (a seeded coin).
    """
    rng = random.Random(f"comm-{seed}")
    noise = random.Random(f"comm-estimate-{seed}")
    names = sorted(model.classes)
    weights = [model.classes[k].share for k in names]
    out: dict[str, JobComm] = {}
    for wid, nodes, passed in jobs:
        klass = rng.choices(names, weights)[0]
        spec = model.classes[klass]
        origin = 1.0
        if model.origin is Origin.TWO_LEAVES and nodes > 1 and passed:
            origin = spread_slowdown(model, klass, nodes, ref_gbps)
        if estimate is EstimateMode.HOPS_ONLY:
            told = None
        elif estimate is EstimateMode.NOISY:
            told = spec.comm_ratio * (1.0 + error if noise.random() < 0.5 else 1.0 - error)
        else:
            told = spec.comm_ratio
        out[wid] = JobComm(klass, spec, origin, passed, told)
    return out


def packed_nodes(pod_devices: Sequence[int], devices_per_node: int) -> int:
    """Nodes a gang spans when packed: its pods' devices over whole nodes."""
    total = sum(pod_devices)
    return max(1, -(-total // max(devices_per_node, 1))) if len(pod_devices) > 1 else 1


def class_counts(profiles: Mapping[str, JobComm]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in profiles.values():
        counts[job.klass.value] = counts.get(job.klass.value, 0) + 1
    return dict(sorted(counts.items()))
