"""How often a hostile pod catches its own account's launches: it spins on kill(-1, SIGSTOP), which
stops every process of its account, including a launch child between its change of user and its
exec. A launcher helper that waits for that exec hangs until the launch deadline (and with it the
control loop's step); one that does not wait is not held. Needs root (pods run as a tenant's
account); prints how many launches missed the deadline.

    .venv/bin/python bench/launch_stall_attack.py [--launches 150] [--timeout-s 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time

SPIN = ("import os, signal, time\n"
        "end = time.time() + 120\n"
        "while time.time() < end:\n"
        "    try:\n"
        "        os.kill(-1, signal.SIGSTOP)\n"
        "    except OSError:\n"
        "        pass\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=150)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("Run it as root: pods run as a tenant's account only then.", file=sys.stderr)
        return 2
    os.environ["GPUPOOL_LAUNCH_TIMEOUT_S"] = str(args.timeout_s)
    from gpupool.agent.identity import BASE_PATH
    from gpupool.errors import ProviderError
    from gpupool.pods import PodLaunch
    from gpupool.providers.local import LocalProvider

    provider = LocalProvider(tempfile.mkdtemp(prefix="gpupool-stall-") + "/agent", simulate="1xH100",
                             node_name="box")
    uid = provider.agent.identities.resolve("stall-attack", "").uid
    python = shutil.which("python3", path=BASE_PATH) or sys.executable  # one the account may run
    try:
        provider.launch(PodLaunch(pod_id="spin", workload_id="w-spin", node="box", tenant="stall-attack",
                                  command=(python, "-c", SPIN)))
        time.sleep(1.0)
        missed, began = 0, time.monotonic()
        for number in range(args.launches):
            try:
                provider.launch(PodLaunch(pod_id=f"victim-{number}", workload_id=f"w-victim-{number}",
                                          node="box", tenant="stall-attack", command=("true",)))
            except ProviderError:
                missed += 1
        took_s = time.monotonic() - began
    finally:
        provider.close(stop_pods=True)
        for pid in os.listdir("/proc"):  # what the attack left stopped: this run's account only
            with contextlib.suppress(OSError, ValueError):
                if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
                    os.kill(int(pid), signal.SIGKILL)
    print(f"{missed} of {args.launches} launches missed the {args.timeout_s:g} s deadline "
          f"({took_s:.1f} s for all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
