"""gpupool: pool accelerators across InfiniBand-connected servers and schedule work onto slices."""

__version__ = "0.1.0"
