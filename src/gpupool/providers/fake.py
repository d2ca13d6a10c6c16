"""The in-memory provider for the simulator and tests: deterministic, clock-driven, with faults."""

from __future__ import annotations

from gpupool.providers.nodespec import SPEC_SYNTAX, nodes_from_openb_csv, nodes_from_spec

__all__ = ["SPEC_SYNTAX", "nodes_from_openb_csv", "nodes_from_spec"]
