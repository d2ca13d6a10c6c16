"""fed.yaml as the hub reads it: the one reader is gpupool/fedfile.py (the replay reads it too)."""

from gpupool.fedfile import POLICIES, FederationConfig, MemberConfig, TenantPolicy, load_federation

__all__ = ["POLICIES", "FederationConfig", "MemberConfig", "TenantPolicy", "load_federation"]
