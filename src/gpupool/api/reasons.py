"""One catalogue of reasons: for each code a decision or an event records, whether it is final, a
sentence that says what happened and a hint that says what the user can do.

The core's scheduling reasons (`core.model.Reason`) and the server's event reasons
(`api.events.EventReason`) are two enums with disjoint codes; every member of both has exactly one
entry here (tests/test_reasons.py checks it, and that every member is produced somewhere). The store
keeps only the code; the catalogue is applied when answering (the API's `reason_text`, `reason_hint`,
`reason_final`; `gpupool show`), never on the loop's or the submit path's writes. A code the store
holds from an older version and no enum knows any more reads as itself, with no sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gpupool.api.events import EventReason
from gpupool.core.model import Reason


@dataclass(frozen=True, slots=True)
class ReasonInfo:
    """One reason code: `final` when the workload will not run (again) after it."""

    code: str
    final: bool
    text: str
    hint: str


_R, _E = Reason, EventReason
_QUEUE_LS = "`gpupool queue ls`"

_ENTRIES: tuple[tuple[StrEnum, bool, str, str], ...] = (
    # ---- the core's scheduling decisions: why a workload waits, was refused or was stopped
    (_R.NO_NODE_FITS, False, "No node has room for one of its pods right now.",
     "It waits for running work to end; asking for less fits sooner (`gpupool node ls` shows what is "
     "free)."),
    (_R.INSUFFICIENT_CPU, False, "No node has enough free cpu for one of its pods.",
     "It waits for cpu to free up; a smaller --cpu fits sooner."),
    (_R.INSUFFICIENT_MEMORY, False, "No node has enough free host memory for one of its pods.",
     "It waits for memory to free up; a smaller --memory fits sooner."),
    (_R.INSUFFICIENT_DEVICES, False,
     "No node has enough free devices, or a free enough share of one, for one of its pods.",
     "It waits for devices to free up; fewer --gpus, a smaller fraction or less --gpu-memory fits sooner."),
    (_R.NO_ALLOWED_MODEL, False, "No node has a free device of the models it allows.",
     "It waits for such a device; allow more models with --models, or none to take any."),
    (_R.GANG_INCOMPLETE, False,
     "Not every pod of its gang fits at once, so none was placed (all or nothing).",
     "It waits until all its replicas fit together; fewer --replicas fit sooner."),
    (_R.QUOTA_EXCEEDED, False, "Its queue has used its quota and what its cohort may lend it.",
     f"It waits for its queue's running work to end; {_QUEUE_LS} shows quotas and use, and an admin "
     "may raise a quota with `gpupool queue set`."),
    (_R.NEVER_FITS, True, "No node of the pool could ever hold one of its pods.",
     "Resubmit asking for less (gpus, memory, cpu, models); `gpupool node ls` shows what the nodes have. "
     "Cordoned nodes and failed devices count as the room they have when they are back."),
    (_R.PREEMPTED, False, "Stopped to make room for higher-priority work; it waits to run again.",
     "It resumes from its last checkpoint (save to GPUPOOL_CHECKPOINT_DIR); a priority class that is not "
     "preemptible avoids this."),
    (_R.EVICTED_UNHEALTHY, False,
     "A device or node it ran on became unhealthy; it was stopped and waits to run on healthy hardware.",
     "Nothing to do: it is placed again; checkpoints in GPUPOOL_CHECKPOINT_DIR keep its progress."),
    (_R.BACKFILL_BLOCKED, False,
     "Starting it now would delay the reserved start of the workload at the head of the queue.",
     "It waits for the reservation; a --time-limit short enough to end before it lets it start in the gap."),
    (_R.WAITING_FOR_HEAD, False, "An older workload of its queue waits to be placed first.",
     "It starts after the work ahead of it; `gpupool ls -s pending` shows the queue."),
    (_R.RECLAIMED, False,
     "Stopped because its queue ran on borrowed quota that the lending queue now needs back.",
     f"It waits to run again within its queue's quota ({_QUEUE_LS}); work within the nominal quota is "
     "never reclaimed."),
    (_R.SERVING_HEADROOM, False,
     "Starting it would take room the pool keeps free so that its inference services can grow at once.",
     "It starts once the services' headroom is free beside it (serving.headroom_replicas in the pool's "
     "configuration; `gpupool config show`)."),
    (_R.BUDGET_EXHAUSTED, False, "Its tenant spent its budget for this period; running work continues.",
     "It waits for the next budget period; an admin may raise the budget or allow overdraft with "
     "`gpupool tenant set`."),
    (_R.WAITING_FOR_LOCALITY, False,
     "It could start now spread over the fabric, but waits a little for a leaf or spine group of its own, "
     "where it runs faster; its domain is reserved meanwhile.",
     "Nothing to do: it starts spread once waiting would cost more than spreading, or after the pool's "
     "max_wait; --topology none lets it start anywhere at once."),
    (_R.CONGESTION_MOVED, False,
     "Its slowest link stayed congested longer than the pool allows, so it was stopped to be placed "
     "away from it.",
     "Nothing to do: it resumes from its last checkpoint in GPUPOOL_CHECKPOINT_DIR on a quieter part "
     "of the fabric."),
    (_R.MOVED_FOR_LOCALITY, False,
     "Moved while running: a gang that ran spread over several leaves was stopped and started again "
     "inside one, where it runs faster, and single-node work made room for it by moving too.",
     "Nothing to do: it resumed at once on its new nodes from its last checkpoint in "
     "GPUPOOL_CHECKPOINT_DIR (work since then is done again)."),
    (_R.NO_DOMAIN_FITS, False,
     "Its topology constraint asks for one leaf or spine group, and none has room for the whole gang now.",
     "It waits for running work there to end; --topology preferred=... lets it widen to the next tier."),
    (_R.UNKNOWN_PRIORITY_CLASS, True, "Its priority class is not one of the pool's classes.",
     "Resubmit with a class that `gpupool config show` lists."),
    (_R.UNKNOWN_QUEUE, True, "Its queue no longer exists.",
     f"Resubmit to a queue that {_QUEUE_LS} lists."),
    # ---- the server's events: what happened to it
    (_E.SUBMITTED, False, "Accepted; it waits for the scheduler to place it.",
     "`gpupool show` says why it waits once the scheduler has looked at it."),
    (_E.ADMITTED, False, "Placed on nodes; its pods are being started.",
     "`gpupool logs ID -f` follows its output once it runs."),
    (_E.LAUNCHED, False, "Its pods were started.", "`gpupool logs ID -f` follows its output."),
    (_E.COMPLETED, True, "Every pod exited with code 0.", "`gpupool logs ID` shows its output."),
    (_E.POD_FAILED, True, "A pod exited with a non-zero code and no retries were left, so it failed.",
     "`gpupool logs ID` shows why; resubmit, with --max-retries N to run it again after a failure."),
    (_E.POD_LOST, True, "A pod was lost (the provider cannot tell whether it ran) and no retries were left, "
     "so it failed rather than run twice.",
     "Resubmit it, or submit with --max-retries N to have it run again after a loss."),
    (_E.LOST_ON_RESTART, True,
     "Its pod could not be re-adopted after a server restart, and it is never started twice.",
     "Resubmit it."),
    (_E.REQUEUED_ON_RESTART, False,
     "It was placed but not yet started when the server stopped; it waits to be placed again.",
     "Nothing to do: it is placed again."),
    (_E.ADOPTED, False, "Its running pod was re-adopted after a server restart.",
     "Nothing to do: it kept running."),
    (_E.LAUNCH_FAILED, True, "The node could not start its pod.",
     "The message says why; fix that (command, workdir, account) and resubmit."),
    (_E.CANCELLED_BY_USER, True, "Cancelled with `gpupool cancel`.", "Resubmit it to run it again."),
    (_E.NODE_DRAINED, False, "Its node was drained with --now; it waits to run on another node.",
     "Nothing to do: it is placed again; checkpoints in GPUPOOL_CHECKPOINT_DIR keep its progress."),
    (_E.TIME_LIMIT, True, "Stopped at its time limit (--time-limit).",
     "Resubmit with a longer --time-limit, resuming from its checkpoints in GPUPOOL_CHECKPOINT_DIR."),
    (_E.RETRYING, False, "A pod failed; it waits out a backoff to run again, within its retries.",
     "`gpupool logs ID` shows why it failed; `gpupool show` counts the retries used."),
    (_E.NODE_LOST, False, "The node it ran on left the pool; it waits to run on another node.",
     "Nothing to do: it is placed again; checkpoints in GPUPOOL_CHECKPOINT_DIR keep its progress."),
    (_E.LINK_LOST, False,
     "A fabric link failed and some of its nodes had no route left to each other; it was stopped and waits "
     "to be placed again.",
     "Nothing to do: it is placed on nodes that can reach each other; checkpoints in "
     "GPUPOOL_CHECKPOINT_DIR keep its progress."),
    (_E.LINK_DEGRADED, False,
     "A fabric link on its routes failed and left it less bandwidth; the event names its new slowest link.",
     "Nothing to do: it keeps running at the bandwidth named; `gpupool show ID --json` gives its "
     "placement's bottleneck."),
    (_E.HELD, False, "Held while pending: the scheduler does not consider it until it is released.",
     "`gpupool release ID` lets it be placed (a hold the admin set only the admin may release)."),
    (_E.RELEASED, False, "Released from its hold; it waits for the scheduler to place it.",
     "`gpupool show` says why it waits once the scheduler has looked at it."),
    (_E.UPDATED, False, "Changed while pending (priority, time limit, gpus or replicas).",
     "The event's message says what changed; `gpupool show` gives the spec it now runs with."),
    (_E.REQUEUED_BY_USER, False, "Stopped with `gpupool requeue` and sent back to pending.",
     "Nothing to do: it is placed again; checkpoints in GPUPOOL_CHECKPOINT_DIR keep its progress."),
    (_E.FEDERATION_FENCED, False,
     "A federation hub's copy held (and stopped, if it ran): the pool has not heard from the hub for "
     "its federation.fence, and the hub may run the work elsewhere.",
     "Nothing to do: when the hub answers again it releases the copy it still places here and "
     "cancels the others."),
    (_E.WAITING_FOR_DEPENDENCY, False,
     "Its --dependency does not hold yet, so the scheduler does not consider it.",
     "It waits for the work it names (the message says which); `gpupool show ID` names the part."),
    (_E.DEPENDENCY_MET, False, "Its --dependency holds now; it waits for the scheduler to place it.",
     "`gpupool show` says why it waits once the scheduler has looked at it."),
    (_E.DEPENDENCY_NEVER_SATISFIED, True,
     "Its --dependency can never hold (work it needed to succeed did not, or the reverse), so it was "
     "cancelled.",
     "Resubmit with a dependency that can hold; --kill-on-invalid-dep no keeps such work pending instead."),
    (_E.DEPENDENCY_NEVER_SATISFIED_KEPT, False,
     "Its --dependency can never hold, and it was submitted with --kill-on-invalid-dep no, so it stays "
     "pending.",
     "Cancel it with `gpupool cancel ID`, or resubmit with a dependency that can hold."),
)

CATALOGUE: MappingProxyType[str, ReasonInfo] = MappingProxyType(
    {code.value: ReasonInfo(code.value, final, text, hint) for code, final, text, hint in _ENTRIES})
"""Every reason code and what it means, keyed by the code the store records."""


def describe(code: str) -> ReasonInfo:
    """The catalogue's entry for `code`; for a code no enum knows (or ""), one with no text."""
    return CATALOGUE.get(code) or ReasonInfo(code, False, "", "")
