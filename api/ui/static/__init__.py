"""The admin UI's page, scripts and style sheet (a package only so that they ship with it)."""
