"""`gpupool submit`: the typer form (help text, and use from other typer code); see submit_fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def submit(
    command: Annotated[
        list[str] | None, typer.Argument(help="The program and its arguments, after `--`.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", "-n", help="A name to recognise it by.")] = None,
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Admin only: submit for this tenant.")
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", "-q", help="The tenant's queue (default: default).")
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", "-p", help="-1000..1000, higher runs first within its "
                                 "priority class.")
    ] = None,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="A priority class of the pool (`gpupool config "
                                 "show` lists them; default: normal, else the lowest non-negative one); "
                                 "the class ranks first, --priority orders within it.")
    ] = None,
    time_limit: Annotated[
        str | None, typer.Option("--time-limit", help="Stop its pods this long after they start (Slurm's "
                                 "--time): 90s, 30m, 2h, 1d, 1:30:00 or 2-12:00:00; backfill plans with "
                                 "it. A bare number is refused (Slurm reads minutes).")
    ] = None,
    checkpoint_every: Annotated[
        str | None, typer.Option("--checkpoint-every", help="It saves a checkpoint in "
                                 "$GPUPOOL_CHECKPOINT_DIR at least this often (30m, 2h): a preemption "
                                 "costs it at most that much work, and where the pool moves running "
                                 "work for locality (topology_moves) it may be moved.")
    ] = None,
    max_retries: Annotated[
        int | None, typer.Option("--max-retries", help="0..1000 requeues after a pod fails (exit code != 0) "
                                 "before it fails for good (default: the pool's failure.max_retries).")
    ] = None,
    array: Annotated[
        str | None, typer.Option("--array", "-a", help="Slurm's --array: one task per index, e.g. 0-999, "
                                 "1,3,5-9 or 0-15:4, at most 10000 tasks, indexes up to 99999; '%N' lets "
                                 "at most N run at once (0-999%50). Prints the array's id; tasks are "
                                 "ID_INDEX and get GPUPOOL_ARRAY_INDEX.")
    ] = None,
    gpus: Annotated[
        float | None,
        typer.Option("--gpus", "-g", help="A fraction of one device (0.25) or whole devices (2)."),
    ] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="Device memory per device, e.g. 8GiB.")
    ] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="Cores (4, 0.5) or milli-cores (500m).")] = None,
    memory: Annotated[str | None, typer.Option("--memory", "-m", help="Host memory, e.g. 16GiB.")] = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", "-r", help="Pods placed all-or-nothing.")
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="Allowed device model (repeatable).")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for the pods (repeatable); not one of "
                                       "the variables the pool sets itself (GPUPOOL_TENANT, ...).")
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option("--workdir", "-w", help="Working directory of the pods, an absolute path (default: this "
                     "directory when their node has it and lets them in, else a private one; see `gpupool "
                     "show`)."),
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="A YAML spec; flags override its fields.")
    ] = None,
    topology: Annotated[
        str | None, typer.Option("--topology", help="Where a gang's pods may sit in the fabric: "
                                 "required=leaf|spine (all in one domain, or wait), preferred=leaf|spine "
                                 "(start there, widen a tier if nothing fits), slice=N@leaf (groups of N "
                                 "pods each in one leaf), comm=RATIO (how much the gang communicates: its "
                                 "all-reduce time over its compute time, e.g. 0.2 light, 1.5 heavy; the "
                                 "network-aware policy weighs placements by it), comma-joined, or none "
                                 "(default: the pool's, preferred=leaf, for multi-pod gangs). See "
                                 "docs/fabric.md.")
    ] = None,
    dependency: Annotated[
        str | None, typer.Option("--dependency", "-d", help="Slurm's --dependency: afterok:ID[:ID...] (start "
                                 "after they all succeeded), afterany:ID[:ID...] (after they all ended), "
                                 "afternotok:ID[:ID...] (after they all ended without succeeding), "
                                 "singleton (after every earlier workload of this --name ended); "
                                 "comma-joined, all must hold. An ID may be an array's id. Until they "
                                 "hold, `gpupool show` says what it waits for.")
    ] = None,
    kill_on_invalid_dep: Annotated[
        str | None, typer.Option("--kill-on-invalid-dep", help="yes (default): cancel it, with the reason, "
                                 "when its dependency can never hold (afterok on work that failed); no: "
                                 "keep it pending with that reason.")
    ] = None,
    launcher: Annotated[
        str | None, typer.Option("--launcher", help="torchrun: run the command under torchrun in each pod "
                                 "(--nnodes = the pods, --node-rank = the pod's rank, --nproc-per-node = "
                                 "its whole devices, at MASTER_ADDR:MASTER_PORT), so WORLD_SIZE, RANK and "
                                 "LOCAL_RANK count processes; none (default): the command as given. See "
                                 "docs/cli.md, Distributed training.")
    ] = None,
    separate_stderr: Annotated[
        bool, typer.Option("--separate-stderr", help="Keep stderr in its own log (like sbatch --error); by "
                           "default stdout and stderr are one log, in the order written.")
    ] = False,
    image: Annotated[
        str | None, typer.Option("--image", help="Run each pod in this image of the pool's store (gpupool "
                                 "image ls), in a container as the tenant's account; its --workdir, else its "
                                 "private directory, is bound in. A name the pool lacks: exit 2.")
    ] = None,
    mount: Annotated[
        list[str] | None, typer.Option("--mount", help="SRC:DST[:ro] (repeatable): a node path inside the "
                                       "roots the pool allows the tenant (tenants.<name>.mounts), seen by "
                                       "the pods at DST (which must exist on the node); :ro read-only.")
    ] = None,
    secret: Annotated[
        list[str] | None, typer.Option("--secret", help="NAME (each key a variable), NAME:ENV_VAR (its one "
                                       "key) or NAME:/run/secrets/FILE (a 0400 file; a directory of one "
                                       "file per key): one of the tenant's secrets (gpupool secret "
                                       "create), repeatable.")
    ] = None,
    constraint: Annotated[
        list[str] | None, typer.Option("--constraint", "-C", help="KEY or KEY=VALUE (repeatable, all must "
                                       "hold): place the pods only on nodes carrying that label (Slurm's "
                                       "--constraint, Kubernetes' nodeSelector; `gpupool node ls -o wide` "
                                       "lists them). One no node carries: exit 2. --image adds "
                                       "gpupool.io/containers by itself.")
    ] = None,
) -> None:
    """Submit a workload (or with --array, one task per index) and print only its id.

    Example: gpupool submit --gpus 0.25 --time-limit 2h -- python train.py

    Example: gpupool submit --array 0-99%10 --gpus 1 -- python sweep.py   (reads GPUPOOL_ARRAY_INDEX)

    Example: gpupool submit --dependency afterok:w-1a2b3c4d5e6f -- python evaluate.py

    Example: gpupool submit --mount /data/team-a/set:/data:ro --secret hf:HF_TOKEN -- python train.py

    Example: gpupool submit --replicas 2 --gpus 8 --launcher torchrun -- python train.py

    Example: gpupool submit --constraint zone=a --gpus 1 -- python train.py

    Exit codes: 0 submitted, 2 bad usage or refused (quota, invalid spec or dependency, a priority or
    class above the tenant's max priority, too many pending), 3 queue/tenant, or a workload the
    dependency names, not found or forbidden, 4 server unreachable.
    """
    from gpupool.cli.submit_fast import run

    args: list[str] = []
    pairs = [
        ("--name", name),
        ("--tenant", tenant),
        ("--queue", queue),
        ("--priority", priority),
        ("--priority-class", priority_class),
        ("--time-limit", time_limit),
        ("--checkpoint-every", checkpoint_every),
        ("--max-retries", max_retries),
        ("--array", array),
        ("--gpus", gpus),
        ("--gpu-memory", gpu_memory),
        ("--cpu", cpu),
        ("--memory", memory),
        ("--replicas", replicas),
        ("--workdir", workdir),
        ("--file", file),
        ("--topology", topology),
        ("--dependency", dependency),
        ("--kill-on-invalid-dep", kill_on_invalid_dep),
        ("--image", image),
        ("--launcher", launcher),
    ]
    for flag, value in pairs:
        if value is not None:
            args += [flag, str(value)]
    if separate_stderr:
        args.append("--separate-stderr")
    for flag, values in (("--model", model), ("--env", env), ("--mount", mount), ("--secret", secret),
                         ("--constraint", constraint)):
        for value in values or []:
            args += [flag, value]
    raise typer.Exit(run([*args, "--", *(command or [])]))
