"""MosaicML's GraphQL API on a Tessera server, so the real `mcli` client (CLI and SDK, mosaicml-cli 0.8.3)
works unchanged with `MOSAICML_API_ENDPOINT=http://HOST:PORT/graphql` and `MOSAICML_API_KEY=<a Tessera
key>` (docs/mcli.md). Every operation is one call of the caller's team's Platform, the same one the
REST API's routes make: schema.py (the operations), types.py / inputs.py (MCLI's shapes), views.py
(a run in MCLI's words), runs.py, clusters.py, secrets.py, logs.py (the resolvers), context.py (keys,
errors, worker threads).
"""

from __future__ import annotations

from fastapi import FastAPI

from tessera.platform.server.graphql.schema import router


def mount(app: FastAPI) -> None:
    """Serve the GraphQL API on /graphql (POST, and websockets for subscriptions)."""
    app.include_router(router())
