"""REST API (FastAPI): thin routes over control.api_ops; a token on every route but /healthz
and the dashboard's static files; bodies bounded before parsing; every status documented."""
