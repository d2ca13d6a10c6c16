"""`gpupool up --federation FILE`: serve a federation hub (docs/federation.md)."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

from gpupool.federation.app import NoNodes, create_hub
from gpupool.federation.config import load_federation


def serve_hub(federation: Path, data_dir: Path | None, host: str, port: int, database_url: str,
              tls_cert: Path | None, tls_key: Path | None) -> None:
    """Start the hub and serve until stopped; a bad fed.yaml stops it first (InvalidInput)."""
    import uvicorn

    from gpupool.server.datadir import pool_id, secure_data_dir
    from gpupool.server.db import Store
    from gpupool.server.runtime import Runtime
    from gpupool.server.services.tenants import bootstrap
    from gpupool.server.settings import Settings, default_data_dir

    config = load_federation(federation)  # one sentence per problem, before anything starts
    settings = Settings(data_dir=data_dir or default_data_dir(), host=host, port=port,
                        database_url=database_url, tls_cert=tls_cert, tls_key=tls_key).with_env()
    secure_data_dir(settings.data_dir)
    from dataclasses import replace

    settings = replace(settings, pool_id=pool_id(settings.data_dir))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    store = Store.open(settings.resolved_database_url)
    rt = Runtime(settings=settings, store=store, provider=NoNodes())
    token = bootstrap(rt)
    served = create_hub(rt, config)
    for notice in served.notices:
        print(f"Warning: {notice}", file=sys.stderr, flush=True)
    up = sum(link.state.up for link in served.hub.links)
    print(f"Federation hub of {len(config.members)} members ({up} answering; placement {config.policy}); "
          f"admin token in {settings.admin_token_path} "
          f"({'created now' if token else 'created at first start'}).",
          flush=True)
    print(f"gpupool hub is serving on {settings.scheme}://{host}:{port}; stop with Ctrl-C.", flush=True)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    served.hub.start()
    try:
        server = uvicorn.Server(uvicorn.Config(served.app, host=host, port=port, log_level="warning",
                                               access_log=False, ssl_certfile=tls_cert, ssl_keyfile=tls_key))
        served.app.state.stopping = lambda: server.should_exit
        server.run()
        if not server.started:
            sys.exit(3)
    finally:
        served.hub.stop()
        store.close()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)
