"""The test tree's own rules: test modules outside packages need unique basenames (pytest imports
them by basename, and two alike fail collection on a clean checkout); test files never share a pod
network."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_modules_have_unique_basenames() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if (path.parent / "__init__.py").exists():
            continue  # inside a package: imported by its dotted name
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: where for name, where in seen.items() if len(where) > 1}
    assert not clashes, f"rename one of each: {clashes}"


POD_NETWORK_LITERAL = re.compile(r"""["'](\d+\.\d+\.\d+\.\d+/\d+)["']""")


def test_test_files_never_share_a_pod_network() -> None:
    """Each test file that makes pod networks names its own (a /19, one node's block, or larger):
    files run at once on other workers, and two pools on one subnet collide (the second agent
    refuses to start with GPUPOOL_POD_NETNS=on, or runs its pods without namespaces on auto)."""
    owners: dict[ipaddress.IPv4Network, set[str]] = defaultdict(set)
    for path in TESTS.rglob("*.py"):
        for literal in POD_NETWORK_LITERAL.findall(path.read_text()):
            try:
                network = ipaddress.IPv4Network(literal, strict=False)
            except ValueError:
                continue  # an address a test refuses on purpose
            if network.prefixlen <= 19:
                owners[network].add(path.relative_to(TESTS).as_posix())
    shared = sorted((str(a), str(b), sorted(owners[a] | owners[b]))
                    for a in owners for b in owners
                    if a <= b and a.overlaps(b) and len(owners[a] | owners[b]) > 1)
    assert not shared, f"give each of these files a pod network of its own: {shared}"


REPLICA_BINDS_PORT = re.compile(r"""environ\[['"]PORT['"]\]""")


def test_test_files_whose_replicas_bind_their_port_keep_to_their_workers_ports() -> None:
    """A replica binds its $PORT on the host where pods run without network namespaces: each file whose
    replicas do starts its pools with ports.serving_config(), so two workers' pools never give two
    replicas one port (tests/ports.py, replica_slice)."""
    missing = sorted(path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
                     if REPLICA_BINDS_PORT.search(text := path.read_text())
                     and "serving_config()" not in text)
    assert not missing, f"start these files' pools with --config holding ports.serving_config(): {missing}"


GANG_MEETS = re.compile(r"\bALL_REDUCE\b")


def test_test_files_whose_gangs_meet_at_their_port_keep_to_their_workers_ports() -> None:
    """A gang's rank 0 binds its MASTER_PORT on the host where pods run without network namespaces:
    each file whose gangs really meet (an ALL_REDUCE) starts its pools with ports.gang_config(), so two
    workers' pools never give two gangs running at once one port (tests/ports.py, gang_slice)."""
    missing = sorted(path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
                     if GANG_MEETS.search(text := path.read_text()) and "gang_config(" not in text)
    assert not missing, f"start these files' pools with --config holding ports.gang_config(): {missing}"
