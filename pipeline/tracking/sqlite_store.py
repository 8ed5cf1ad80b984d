"""A new MLflow sqlite store starts as a copy of a template, instead of MLflow migrating it.

MLflow makes a new sqlite store by creating its tables and running every schema migration (alembic, about a
hundred): about 4 s of CPU on a 2-core machine, in each run that writes to a store not made before. A fine-tuning
run of a small model spent longer on that than on training. For one MLflow version the migrations always give
the same empty schema, so they run once per environment, into a template beside the environment
(`<venv>/mlflow_store/`, made by launchers/setup_env.sh or by the first run that needs it), and a new store is a
copy of it. MLflow then finds its tables at the head revision, checks that as it checks any store, and adds its
Default experiment as it does in a new store.

Best effort, like all tracking: where the template cannot be made or copied, MLflow makes the store itself.

    python -m pipeline.tracking.sqlite_store     (makes the template now; setup_env.sh runs it)
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from importlib.metadata import version
from pathlib import Path


def sqlite_file(uri: str) -> Path | None:
    """The file of a `sqlite:///PATH` tracking URI (relative to the working directory, as SQLAlchemy reads it);
    None for another kind of store or an in-memory database."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def template_folder() -> Path:
    """Where this environment keeps its template: `<venv>/mlflow_store`, or the user's cache outside a virtual
    environment (a system prefix is not ours to write to)."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "mlflow_store"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "roberta-pipeline" / "mlflow_store"


def template_path() -> Path:
    """The template of the installed MLflow: one per version, whose migrations made it."""
    return template_folder() / f"mlflow-{version('mlflow')}.db"


def ensure_template() -> Path:
    """The template, made now if it is missing: MLflow's own table creation and migrations on an empty file,
    written under a temporary name and renamed into place, so a reader never sees half a template."""
    path = template_path()
    if path.exists():
        return path
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables  # what MLflow runs on an empty database

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = unique_sibling(path)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{temporary}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(temporary, path)
    finally:
        Path(temporary).unlink(missing_ok=True)
    return path


def unique_sibling(path: Path) -> Path:
    """A name beside `path` that no other process picks: where a file is written before it takes `path`'s place."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


def start_from_template(uri: str) -> bool:
    """Copy the template to a sqlite store that does not exist yet; True when the copy is the new store.

    The copy is linked into place, which fails if the file appeared meanwhile (another process making the same
    store): that store is then used as it is.
    """
    target = sqlite_file(uri)
    if target is None or target.exists():
        return False
    try:
        template = ensure_template()
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = unique_sibling(target)
        try:
            shutil.copyfile(template, temporary)  # a new file: the user's umask sets its mode, as MLflow's would
            os.link(temporary, target)
        finally:
            Path(temporary).unlink(missing_ok=True)
        return True
    except FileExistsError:
        return False
    except Exception as err:  # noqa: BLE001 - MLflow makes the store itself: slower, never wrong
        print(f"note: MLflow store {target} made by MLflow's migrations (no template: {type(err).__name__}: "
              f"{str(err)[:200]})", file=sys.stderr)
        return False


if __name__ == "__main__":
    print(f"MLflow store template: {ensure_template()}")
