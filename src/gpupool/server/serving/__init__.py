"""Inference services in the live pool: their store rows, the controller that keeps their replicas,
the probes, and the contract the data plane reads (endpoints.py)."""
