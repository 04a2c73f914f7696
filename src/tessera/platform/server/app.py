"""`create_app(settings)`: the FastAPI application of the control plane.

Routers under /api/v1 (auth on every route but /api/v1/health), request bodies limited to
`settings.max_body_bytes` (413, by Content-Length and by counting a streamed body), every error as
application/problem+json with a stable `code` (problems.py), the web console at / with its assets at
/static, and the API's docs page at /api/v1/docs, whose Swagger UI scripts and styles are the
`fastapi-offline` package's own files, served from here (FastAPI's default page loads them from a CDN:
blank without internet).
The database is migrated to the newest schema before the app is returned; the replica's supervision
thread (supervision/replica.py) runs between the app's start and its shutdown.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

from tessera import __version__
from tessera.platform.api.models import Health
from tessera.platform.secrets.vault import claim_secrets_key
from tessera.platform.server import graphql, problems
from tessera.platform.server.accounts import Accounts
from tessera.platform.server.audit import AuditLog
from tessera.platform.server.routers import account, admin, clusters, run_output, runs, secrets
from tessera.platform.server.settings import ServerSettings
from tessera.platform.server.state import ServerState
from tessera.platform.server.teams import TeamPlatforms, use_server_secret_key
from tessera.platform.store.db import make_engine, migrate, session_factory
from tessera.platform.store.leases import Replica
from tessera.platform.supervision.context import SupervisorSettings
from tessera.platform.supervision.replica import ReplicaSupervision

STATIC = Path(__file__).resolve().parent / "static"
API = "/api/v1"
SWAGGER_UI = Path(str(files("fastapi_offline") / "static"))   # swagger-ui-bundle.js, swagger-ui.css, favicon
DOCS_ASSETS = f"{API}/docs/assets"


def create_app(settings: ServerSettings) -> FastAPI:
    """The app of one replica: the store migrated (once, by whichever replica gets there first), an older
    version's server home imported, the secrets key checked against the store's, this replica registered;
    its supervision thread runs while the app does."""
    engine = make_engine(settings.db_url)
    migrate(engine)
    use_server_secret_key(settings.home)
    claim_secrets_key(engine, settings.home)
    replica = Replica(replica_id(settings), url=settings.url)
    supervision = ReplicaSupervision(engine, replica, lambda team: teams.home(team),
                                     replace(SupervisorSettings.from_env(), lease_seconds=settings.lease_seconds,
                                             artifacts_url=settings.artifacts_url))
    teams = TeamPlatforms(engine, settings.home, supervision.wake, artifacts_url=settings.artifacts_url)
    teams.import_old_homes()
    state = ServerState(settings, engine, Accounts(session_factory(engine)), AuditLog(engine), teams, replica,
                        supervision)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        supervision.start()
        yield
        supervision.stop()
        engine.dispose()

    app = problems.ProblemApp(title="Tessera control plane", version=__version__, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes, docs_url=None, redoc_url=None,
                  openapi_url=f"{API}/openapi.json")
    app.state.server = state
    api = APIRouter(prefix=API, responses=problems.ERROR_RESPONSES)
    api.add_api_route("/health", health, methods=["GET"], tags=["health"])
    for module in (runs, run_output, clusters, secrets, account, admin):
        api.include_router(module.router)
    app.include_router(api)
    graphql.mount(app)   # MosaicML's API for the mcli client (server/graphql/)
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    app.mount(DOCS_ASSETS, StaticFiles(directory=SWAGGER_UI), name="docs-assets")
    app.add_api_route(f"{API}/docs", api_docs, methods=["GET"], include_in_schema=False, response_model=None)
    app.add_api_route("/", console, methods=["GET"], include_in_schema=False, response_model=None)
    return app


def health(request: Request) -> Health:
    return Health(ok=True, version=__version__, replica=request.app.state.server.replica.id)


def replica_id(settings: ServerSettings) -> str:
    """This server process's name among the replicas: host, port and a random part (a replica started
    again is another replica: the leases of the one before expire, they are not silently inherited)."""
    return f"{socket.gethostname()[:40]}:{settings.port}-{uuid.uuid4().hex[:6]}"


def api_docs() -> HTMLResponse:
    """Swagger UI on the OpenAPI document, every file of it from this server (works offline)."""
    return get_swagger_ui_html(openapi_url=f"{API}/openapi.json", title="Tessera control plane - API",
                               swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")


def console() -> FileResponse | HTMLResponse:
    index = STATIC / "index.html"
    if index.is_file():
        return FileResponse(index, headers={"Cache-Control": "no-cache"})
    return HTMLResponse("<!doctype html><title>Tessera</title><p>The web console's files are not installed; "
                        f"the API is at <a href='{API}/docs'>{API}/docs</a>.</p>")
