"""MLflow: a run per stage and the model registry.

The modules (import them by name; this package imports nothing, and mlflow is imported only when used):

    runs.py      one MLflow run per stage: params, metrics, wall time, lineage tags; the tracking store
    registry.py  the model registry: register a model folder once by content hash, describe, resolve models:/ URIs
"""
