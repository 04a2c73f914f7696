"""`create_app(settings)`: the FastAPI application of the control plane.

Routers under /api/v1 (auth on every route but /api/v1/health), request bodies limited to
`settings.max_body_bytes` (413, by Content-Length and by counting a streamed body), the platform's
errors as 4xx answers with a one-line `detail`, the web console at / with its assets at /static, and the
API's docs page at /api/v1/docs, whose Swagger UI scripts and styles are the `fastapi-offline` package's
own files, served from here (FastAPI's default page loads them from a CDN: blank without internet).
The database is migrated to the newest schema before the app is returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from tessera import __version__
from tessera.platform.errors import (
    ClusterError,
    PlatformError,
    RunExists,
    RunFailed,
    RunNotFound,
    RunStateError,
    SecretError,
    SecretExists,
    SecretNotFound,
    SpecError,
)
from tessera.platform.secrets.vault import SecretInputError
from tessera.platform.server import graphql
from tessera.platform.server.accounts import AccountExists, AccountNotFound, Accounts
from tessera.platform.server.audit import AuditLog
from tessera.platform.server.routers import account, admin, clusters, run_output, runs, secrets
from tessera.platform.server.settings import ServerSettings
from tessera.platform.server.state import ServerState
from tessera.platform.server.teams import TeamPlatforms, use_server_secret_key
from tessera.platform.store.db import make_engine, migrate, session_factory

STATIC = Path(__file__).resolve().parent / "static"
API = "/api/v1"
SWAGGER_UI = Path(str(files("fastapi_offline") / "static"))   # swagger-ui-bundle.js, swagger-ui.css, favicon
DOCS_ASSETS = f"{API}/docs/assets"
MAX_DETAIL = 1000

# Most specific first: the first class an error is an instance of gives its status.
_STATUS: list[tuple[type[Exception], int]] = [
    (RunNotFound, 404), (AccountNotFound, 404), (AccountExists, 409), (RunExists, 409), (RunStateError, 409), (RunFailed, 409),
    (SecretExists, 409), (SecretNotFound, 404),
    (SpecError, 422), (SecretInputError, 422), (SecretError, 400), (ClusterError, 400), (PlatformError, 400), (ValueError, 400),
]


def create_app(settings: ServerSettings) -> FastAPI:
    engine = make_engine(settings.db_url)
    migrate(engine)
    sessions = session_factory(engine)
    use_server_secret_key(settings.home)
    teams = TeamPlatforms(settings.home)
    state = ServerState(settings, engine, Accounts(sessions), AuditLog(sessions, teams.has_run), teams)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.audit.settle_pending()   # entries of changes a stopped server was making (audit.py)
        state.teams.resume_supervisors()
        yield
        engine.dispose()

    app = FastAPI(title="Tessera control plane", version=__version__, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes, docs_url=None, redoc_url=None,
                  openapi_url=f"{API}/openapi.json")
    app.state.server = state
    api = APIRouter(prefix=API)
    api.add_api_route("/health", health, methods=["GET"], tags=["health"])
    for module in (runs, run_output, clusters, secrets, account, admin):
        api.include_router(module.router)
    app.include_router(api)
    graphql.mount(app)   # MosaicML's API for the mcli client (server/graphql/)
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    for error, _ in _STATUS:
        app.add_exception_handler(error, _platform_error)
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    app.mount(DOCS_ASSETS, StaticFiles(directory=SWAGGER_UI), name="docs-assets")
    app.add_api_route(f"{API}/docs", api_docs, methods=["GET"], include_in_schema=False, response_model=None)
    app.add_api_route("/", console, methods=["GET"], include_in_schema=False, response_model=None)
    return app


def health() -> dict[str, object]:
    return {"ok": True, "version": __version__}


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


def one_line(text: str) -> str:
    """A multi-line message (a spec's problems, one per line) as one line: "a: - b; - c"."""
    out = ""
    for line in (raw.strip() for raw in text.splitlines()):
        if line:
            out += (" " if out.endswith(":") else "; " if out else "") + line
    return out[:MAX_DETAIL]


async def _platform_error(_request: Request, exc: Exception) -> JSONResponse:
    status = next(code for error, code in _STATUS if isinstance(exc, error))
    return JSONResponse({"detail": one_line(str(exc)) or type(exc).__name__}, status_code=status)


async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """One line naming each bad field; never the input (a secret's body holds values)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        problems.append(f"{where}: {str(error.get('msg', 'invalid')).removeprefix('Value error, ')}")
    return JSONResponse({"detail": one_line("; ".join(problems))}, status_code=422)
