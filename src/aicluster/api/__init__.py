"""REST API (FastAPI): thin routes over control.service; a token on every route but /healthz."""
