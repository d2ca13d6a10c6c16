"""Start and stop the CUDA MPS control daemon the agent's fractional pods connect to.

The daemon gets private pipe and log directories under the agent's state directory, so only pods
given CUDA_MPS_PIPE_DIRECTORY (fractional slices) become MPS clients; whole-device pods run bare.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpupool.errors import ProviderError

MPS_CONTROL = "nvidia-cuda-mps-control"
_TIMEOUT_S = 15.0
_KEPT = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "HOME")
_KEPT_PREFIXES = ("CUDA_", "NVIDIA_", "__GL_")


def daemon_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What of the agent's environment the control daemon gets: the paths and the CUDA and NVIDIA
    settings an operator may give it, nothing else. The MPS server it starts runs as the first
    client's account (a tenant's), so the server's own variables (its database URL, tokens, the
    pool's settings) must not be there to be inherited."""
    return {k: v for k, v in environ.items() if k in _KEPT or k.startswith(_KEPT_PREFIXES)}


class MpsDaemon:
    """One MPS control daemon for this node's GPUs. start() and stop() block briefly; idempotent."""

    def __init__(self, base_dir: Path, binary: str | None = None) -> None:
        self.pipe_dir = Path(base_dir) / "mps" / "pipe"
        self.log_dir = Path(base_dir) / "mps" / "log"
        self.binary = binary or shutil.which(MPS_CONTROL)
        self._running = False

    @property
    def available(self) -> bool:
        return self.binary is not None

    @property
    def running(self) -> bool:
        return self._running

    def client_env(self) -> dict[str, str]:
        """What a pod needs to reach this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        assert self.binary is not None
        env = {**daemon_env(os.environ), **self.client_env()}
        try:
            return subprocess.run([self.binary, *args], input=stdin, env=env, capture_output=True,
                                  text=True, timeout=_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProviderError(f"{MPS_CONTROL} did not answer ({exc}); check the NVIDIA driver.") from None

    def start(self) -> None:
        """Start the control daemon (`-d`). Raises ProviderError when it is missing or fails."""
        if self._running:
            return
        if self.binary is None:
            raise ProviderError(f"{MPS_CONTROL} is not installed, so fractional slices cannot use MPS.")
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        result = self._run(["-d"])
        if result.returncode != 0:
            detail = result.stderr.strip() or "no output"
            raise ProviderError(f"{MPS_CONTROL} -d failed with code {result.returncode}: {detail}.")
        self._running = True

    def stop(self) -> None:
        """Ask the daemon to quit (it waits for its clients to exit). Idempotent."""
        if not self._running:
            return
        self._run([], stdin="quit\n")
        self._running = False
