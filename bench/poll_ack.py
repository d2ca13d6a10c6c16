"""What a provider poll costs once a pool has run many pods, with and without its acknowledgement.

    .venv/bin/python bench/poll_ack.py [--finished 100000] [--local-finished 10000] [--running 50]
        [--calls 200] [--json bench/results/poll_ack.json]

The control loop polls its provider at every step (every 20 ms while work is in flight) and the
reconciler looks at every status it gets back. Before poll() had an acknowledgement, a provider
listed every pod it had ever run, so that cost grew with the pool's history. Two sides, measured in
the same run on the same pods:

  listed    the provider is never told (the base contract's default forget_pods: how every
            provider behaved before), so every finished pod stays in poll();
  acked     the reconciler acknowledges (forget_pods) the pods whose final state it has stored.

Each side: `--running` pods that keep running plus `--finished` pods that have ended (fake
provider), and the same on the local provider with `--local-finished` ended pods (their state
files, as a runner leaves them, loaded when the agent starts; `--running` live `sleep` processes).
The reconciler's first sync settles the finished pods (their rows are not in the store, so it only
looks them up); then `--calls` calls of provider.poll() and of Reconciler.sync() are timed. Prints
the median time per call on each side and the ratio listed / acked; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpupool.agent import podstate
from gpupool.config import parse_config
from gpupool.core.model import Slice
from gpupool.pods import PodLaunch, PodPhase
from gpupool.providers.base import Provider
from gpupool.providers.fake import FakeProvider
from gpupool.providers.local import LocalProvider
from gpupool.server.db import Store
from gpupool.server.loops.reconciler import Reconciler
from gpupool.server.runtime import Runtime
from gpupool.server.settings import Settings

SIDES = ("listed", "acked")


class _ListedFake(FakeProvider):
    """The fake provider as it was before the acknowledgement: it forgets nothing."""

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        Provider.forget_pods(self, pod_ids)


class _ListedLocal(LocalProvider):
    """The local provider as it was before the acknowledgement: it forgets nothing."""

    def forget_pods(self, pod_ids: Sequence[str]) -> None:
        Provider.forget_pods(self, pod_ids)


def _median_s(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _reconciler(provider: Provider, data_dir: Path) -> tuple[Reconciler, Store]:
    url = f"sqlite:///{data_dir / 'store.sqlite'}"
    store = Store.open(url)
    rt = Runtime(settings=Settings(data_dir=data_dir, database_url=url), store=store, provider=provider,
                 config=parse_config("scheduling: {placement: first-fit}"))
    return Reconciler(rt), store


def _measure(provider: Provider, data_dir: Path, calls: int) -> dict[str, Any]:
    reconciler, store = _reconciler(provider, data_dir)
    try:
        start = time.perf_counter()
        settled = reconciler.sync()  # the first sync sees every finished pod once
        first_s = time.perf_counter() - start
        poll_s = _median_s(provider.poll, calls)
        sync_s = _median_s(reconciler.sync, calls)
        return {"first_sync_s": first_s, "settled": settled, "listed_after": len(provider.poll()),
                "poll_s": poll_s, "sync_s": sync_s}
    finally:
        store.close()


def _fake(side: str, finished: int, running: int, calls: int, data_dir: Path) -> dict[str, Any]:
    now = [1_000.0]
    provider = (_ListedFake if side == "listed" else FakeProvider)("4x8xH100", clock=lambda: now[0])
    node = provider.nodes()[0].name
    for i in range(finished + running):
        duration = "0" if i < finished else "1e9"
        provider.launch(PodLaunch(pod_id=f"p{i}", workload_id=f"w{i}", node=node, command=("x",),
                                  slices=(Slice(0, 10, 0),), env={"GPUPOOL_FAKE_DURATION_S": duration}))
    now[0] += 1.0
    return _measure(provider, data_dir, calls)


def _local(side: str, finished: int, running: int, calls: int, data_dir: Path) -> dict[str, Any]:
    state = data_dir / "agent"
    pods = state / "pods"
    for i in range(finished):  # as a runner leaves a pod that ended
        (pods / f"p{i}").mkdir(parents=True, mode=0o700)
        podstate.save_record(pods / f"p{i}" / "state.json", podstate.PodRecord(
            pod_id=f"p{i}", command=["true"], workdir=str(pods / f"p{i}"), phase=PodPhase.SUCCEEDED,
            exit_code=0, started_at_s=1.0, finished_at_s=2.0))
    provider = (_ListedLocal if side == "listed" else LocalProvider)(state, simulate="1xT4", node_name="here")
    try:
        for i in range(running):
            provider.launch(PodLaunch(pod_id=f"r{i}", workload_id=f"r{i}", node="here",
                                      command=("sleep", "600"), slices=(Slice(0, 10, 0),)))
        result = _measure(provider, data_dir, calls)
        statuses = provider.poll()
        assert sum(not s.phase.is_final for s in statuses) == running, "the running pods ran throughout"
        return result
    finally:
        provider.close(stop_pods=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--local-finished", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=50)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, default=Path("bench/results/poll_ack.json"))
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    cases: list[tuple[str, Callable[..., dict[str, Any]], int]] = [
        ("fake", _fake, args.finished), ("local", _local, args.local_finished)]
    for provider_name, run, finished in cases:
        for side in SIDES:
            with tempfile.TemporaryDirectory(prefix="poll-ack-") as tmp:
                results[f"{provider_name}/{side}"] = {
                    "finished": finished, "running": args.running,
                    **run(side, finished, args.running, args.calls, Path(tmp))}
    table = Table(title=f"poll cost with finished pods and {args.running} running, "
                        f"median of {args.calls} calls")
    for column in ("provider", "finished", "side", "listed by poll", "poll() ms", "sync() ms",
                   "first sync s", "poll listed/acked", "sync listed/acked"):
        table.add_column(column, justify="right")
    ratios: dict[str, dict[str, float]] = {}
    for provider_name, _, finished in cases:
        listed, acked = results[f"{provider_name}/listed"], results[f"{provider_name}/acked"]
        ratios[provider_name] = {"poll": listed["poll_s"] / acked["poll_s"],
                                 "sync": listed["sync_s"] / acked["sync_s"]}
        for side, row in (("listed", listed), ("acked", acked)):
            last = side == "acked"
            table.add_row(provider_name, f"{finished:,}", side, f"{row['listed_after']:,}",
                          f"{row['poll_s'] * 1e3:.3f}", f"{row['sync_s'] * 1e3:.3f}",
                          f"{row['first_sync_s']:.2f}",
                          f"{ratios[provider_name]['poll']:.0f}x" if last else "",
                          f"{ratios[provider_name]['sync']:.0f}x" if last else "")
    Console(width=150).print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                     "ratios": ratios}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
