"""Prefect flows and their deployments: ``pipeline.py`` (flows and tasks), ``serve.py``."""
