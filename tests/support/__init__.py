"""Shared test helpers: a static file server and the browser launch settings."""
