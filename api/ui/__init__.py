"""The registry's admin UI: one page over the JSON API, served at `/`."""

from api.ui.router import router

__all__ = ["router"]
