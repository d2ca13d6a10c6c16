"""gpupool: pool accelerators across InfiniBand-connected servers and schedule work onto slices."""

__version__ = "0.1.0"

_TYPE_CHECKING = False  # not typing's: `import gpupool` (every CLI start) imports nothing more
if _TYPE_CHECKING:
    from gpupool.remote.pool import Pool


def connect(url: str | None = None, token: str | None = None) -> "Pool":
    """A pool for remote functions (`gpupool.remote`): GPUPOOL_URL / GPUPOOL_TOKEN unless given.
    Imported on first use: `import gpupool` stays light."""
    from gpupool.remote.pool import connect as _connect

    return _connect(url, token)
