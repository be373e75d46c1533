"""``foxhunt``: commands around training runs (the training itself is ``foxhunt-train``).

``foxhunt ui`` opens the MLflow UI on the project's store without the user having to remember
its URI, and prints the URL of the runs table (MLflow 3.17's UI opens in its GenAI view; the
classic runs table needs ``workflowType=machine_learning``). Commands that only read import
neither torch nor lightning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import typer

from foxhunt.commands.ensemble import ensemble_app
from foxhunt.commands.memory import memory_app
from foxhunt.commands.train_jobs import train_app

app = typer.Typer(help="foxhunt: train trading models on CME futures under a memory budget.", no_args_is_help=True)
app.add_typer(ensemble_app, name="ensemble")
app.add_typer(memory_app, name="memory")
app.add_typer(train_app, name="train")


@app.callback()
def _group() -> None:
    """foxhunt: train trading models on CME futures under a measured device-memory budget."""


def store_uri(root: Path) -> str:
    return f"sqlite:///{(root / 'mlruns' / 'mlflow.db').resolve()}"


def runs_table_url(host: str, port: int, experiment_id: str | None) -> str:
    base = f"http://{host}:{port}/"
    if experiment_id is None:
        return base
    return f"{base}#/experiments/{experiment_id}/runs?workflowType=machine_learning"


@app.command()
def ui(
    root: Path = typer.Option(Path("."), help="Folder holding mlruns/ (where you ran foxhunt-train)."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(5000, help="Port to listen on."),
    experiment: str = typer.Option("foxhunt", help="Experiment whose runs table URL is printed."),
) -> None:
    """Serve the MLflow UI on the project's store (mlruns/mlflow.db) and print the runs URL."""
    database = root / "mlruns" / "mlflow.db"
    if not database.is_file():
        typer.echo(f"foxhunt ui: no MLflow store at {database}: run foxhunt-train first (or pass --root)", err=True)
        raise typer.Exit(2)
    uri = store_uri(root)
    experiment_id = _experiment_id(uri, experiment)
    typer.echo(f"MLflow store: {uri}")
    typer.echo(f"Runs table:   {runs_table_url(host, port, experiment_id)}")
    command = [
        sys.executable, "-m", "mlflow", "ui",
        "--backend-store-uri", uri,
        "--host", host, "--port", str(port),
    ]  # fmt: skip
    raise typer.Exit(subprocess.call(command, env={**os.environ, "MLFLOW_TRACKING_URI": uri}))


def _experiment_id(uri: str, name: str) -> str | None:
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(uri).get_experiment_by_name(name)
    return None if experiment is None else experiment.experiment_id


if __name__ == "__main__":
    app()
