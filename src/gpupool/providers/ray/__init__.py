"""The ray provider: gpupool places pods, Ray only carries their processes to the chosen nodes.

Importing this package imports Ray (the `gpupool[ray]` extra); the base install never does.
"""

from gpupool.providers.ray.provider import RayProvider

__all__ = ["RayProvider"]
