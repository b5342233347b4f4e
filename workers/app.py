"""Celery entry point for ``celery -A workers.app worker|beat``."""
from relay import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
