"""The control-plane server: a thin HTTP face (FastAPI on uvicorn) over each team's `Platform`.

Every team has its own platform home under `<server home>/teams/<team>/`, so a team sees only its own
runs, clusters and secrets by construction. The server's own database (SQLAlchemy; SQLite by default,
any URL such as PostgreSQL) holds teams, users, hashed API keys and the audit log, with Alembic
migrations that run at start. `create_app(settings)` in app.py builds the application.
"""
