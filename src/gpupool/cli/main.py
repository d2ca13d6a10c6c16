"""The `gpupool` command: registers each noun's sub-app lazily so start-up stays fast.

The typer application lives in cli/lazy.py and is built on first use (`app` below), so
`gpupool submit`, the one command people run in loops, starts without importing typer.
"""

from __future__ import annotations

import sys

# name -> (module, attribute, help). Each module exposes a typer app; it is imported only when used.
# Groups are named in the singular, like `docker image ls`; ALIASES accepts the plural too.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "profile": ("gpupool.cli.profiles", "app", "Device profiles gpupool knows: ls."),
    "fabric": ("gpupool.cli.fabric", "app",
               "InfiniBand fabrics: show, route, tables, draw, export, generate; status, fail-link, "
               "heal-link."),
    "sim": ("gpupool.cli.sim", "app",
            "Replay cluster traces through the scheduler: fill, replay, federate, serve, colocate."),
    "node": ("gpupool.cli.nodes", "app",
             "Nodes: ls, show; cordon, uncordon, drain, fail, heal (admin); join, leave."),
    "tenant": ("gpupool.cli.tenant", "app", "Tenants (admin): create, set, ls, delete."),
    "queue": ("gpupool.cli.queue", "app", "Queues, quotas and cohorts (admin): create, set, ls."),
    "token": ("gpupool.cli.token", "app", "Bearer tokens: create (admin), ls, revoke."),
    "secret": ("gpupool.cli.secret", "app", "A tenant's secrets: create, ls, delete (never shown)."),
    "config": ("gpupool.cli.config", "app", "The pool's configuration (YAML): show, check."),
    "image": ("gpupool.cli.image", "app", "Container images: import (admin), ls, rm (admin)."),
    "fed": ("gpupool.cli.fed", "app", "A federation hub's member pools: ls."),
    "service": ("gpupool.cli.service", "app",
                "Inference services: create, ls, show, scale, update, delete, partners."),
    "server": ("gpupool.cli.servers", "app", "The servers sharing the pool's store (admin): ls."),
}
ALIASES: dict[str, str] = {"profiles": "profile", "nodes": "node", "tenants": "tenant", "queues": "queue",
                           "tokens": "token", "images": "image", "secrets": "secret",
                           "services": "service", "servers": "server"}
"""The other spelling of each group's name, accepted but not listed in help."""

# Top-level commands (not groups): name -> (module, function, help).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("gpupool.cli.up", "up", "Start the pool: API server, scheduler and local agent."),
    "submit": ("gpupool.cli.submit", "submit", "Submit a workload; prints only its id."),
    "ls": ("gpupool.cli.ls", "ls", "List workloads."),
    "show": ("gpupool.cli.show", "show", "Show one workload (--json for machines)."),
    "cancel": ("gpupool.cli.cancel", "cancel", "Cancel a workload."),
    "hold": ("gpupool.cli.jobs", "hold", "Keep pending workloads from being placed."),
    "release": ("gpupool.cli.jobs", "release", "Let held workloads be placed."),
    "update": ("gpupool.cli.jobs", "update",
               "Change a pending workload's priority, time limit, gpus or replicas."),
    "requeue": ("gpupool.cli.jobs", "requeue", "Send running workloads back to pending."),
    "run": ("gpupool.cli.run", "run", "Submit, stream the output, exit with its code."),
    # interactive allocations: salloc, and srun --pty / kubectl exec inside one
    "alloc": ("gpupool.cli.alloc", "alloc", "Hold a slice; run a command or a shell inside it (salloc)."),
    "exec": ("gpupool.cli.alloc", "exec_", "Run a command inside a running workload (--pty for a tty)."),
    "logs": ("gpupool.cli.logs", "logs", "Print a workload's output (-f to follow)."),
    "wait": ("gpupool.cli.wait", "wait", "Wait for a workload; exit 0 when it succeeded."),
    "events": ("gpupool.cli.events", "events", "Print workload events (-f to follow them live)."),
    "top": ("gpupool.cli.top", "top", "A live view of the pool."),
    "audit": ("gpupool.cli.audit", "audit", "Show the audit log: admin actions, refused logins (admin)."),
    "usage": ("gpupool.cli.usage", "usage", "Show metered usage and its cost (pooled and dedicated)."),
    "invoice": ("gpupool.cli.usage", "invoice", "Bill one tenant for one month."),
    "completion": ("gpupool.cli.completion", "completion", "Print the shell completion script."),
    # backup and restore of the store and the data directory's keys (admin, on the server's machine)
    "backup": ("gpupool.cli.backup", "backup", "Back up the pool's store and keys to a file (admin)."),
    "restore": ("gpupool.cli.backup", "restore", "Restore a backup into a stopped, fresh pool (admin)."),
}


FAST_COMMANDS = {"submit": "gpupool.cli.submit_fast", "run": "gpupool.cli.run_fast",
                 "alloc": "gpupool.cli.alloc_fast", "exec": "gpupool.cli.exec_fast"}
"""Commands served without typer (their typer twin in COMMANDS gives --help)."""


def __getattr__(name: str) -> object:
    if name == "app":
        from gpupool.cli.lazy import app

        return app
    raise AttributeError(name)


def main() -> None:
    """Entry point: run the CLI, turning gpupool errors into one sentence and an exit code."""
    argv = sys.argv[1:]
    if argv and argv[0] in FAST_COMMANDS and not {"-h", "--help"} & set(argv[1:2] + _options(argv[1:])):
        import importlib

        sys.exit(importlib.import_module(FAST_COMMANDS[argv[0]]).run(argv[1:]))
    from gpupool.cli.lazy import app
    from gpupool.errors import GpupoolError

    try:
        app(standalone_mode=True)
    except GpupoolError as exc:  # pragma: no cover - commands report their own errors
        print(f"Error: {exc.message}", file=sys.stderr)
        sys.exit(exc.exit_code)


def _options(args: list[str]) -> list[str]:
    """The arguments before a `--` (after it everything belongs to the user's command)."""
    return args[: args.index("--")] if "--" in args else args


if __name__ == "__main__":
    main()
