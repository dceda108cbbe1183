"""Prefect flows over the DVC pipeline (no second definition of the DAG: they read dvc.yaml)."""
