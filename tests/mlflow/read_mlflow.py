"""Reads runs back with MLflow's own Python client and prints them as JSON, for the tests.

    read_mlflow.py run URI RUN_ID             one run: info, params, tags, metric histories, artifacts
    read_mlflow.py search URI EXPERIMENT      every run of an experiment (info and tags)
A file: URI is read by MLflow's FileStore (MLFLOW_ALLOW_FILE_STORE=true is set here).
"""
import json
import math
import os
import sys

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
from mlflow import MlflowClient  # noqa: E402


def number(v):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def info(run):
    i = run.info
    return {"run_id": i.run_id, "run_name": i.run_name, "experiment_id": i.experiment_id, "status": i.status,
            "start_time": i.start_time, "end_time": i.end_time, "user_id": i.user_id,
            "artifact_uri": i.artifact_uri}


def artifacts(client, run_id, path=None):
    out = []
    for a in client.list_artifacts(run_id, path):
        if a.is_dir:
            out += artifacts(client, run_id, a.path)
        else:
            out.append({"path": a.path, "size": a.file_size})
    return out


def main():
    what, uri = sys.argv[1], sys.argv[2]
    client = MlflowClient(tracking_uri=uri)
    if what == "run":
        run = client.get_run(sys.argv[3])
        metrics = {}
        for key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            metrics[key] = [[m.step, number(m.value), m.timestamp] for m in history]
        print(json.dumps({"info": info(run), "params": run.data.params, "tags": run.data.tags, "metrics": metrics,
                          "artifacts": artifacts(client, run.info.run_id)}))
    elif what == "search":
        exp = client.get_experiment_by_name(sys.argv[3])
        runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)
        print(json.dumps({"experiment_id": exp.experiment_id if exp else None,
                          "runs": [{"info": info(r), "tags": r.data.tags} for r in runs]}))
    else:
        sys.exit("unknown command " + what)


if __name__ == "__main__":
    main()
