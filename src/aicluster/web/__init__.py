"""The web dashboard: a static single-page app served by the API.

The page itself is public and holds no data; every number it shows comes from
the token-protected JSON API, called from the browser with the bearer token the
user pastes on its login screen.
"""

from aicluster.web.routes import web_router

__all__ = ["web_router"]
