"""WSGI entry point: ``gunicorn app:app``."""
from relay import create_app

app = create_app()
