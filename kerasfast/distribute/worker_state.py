"""What a worker tells the launcher that started it, as structured records.

`kerasfast launch` gives each worker the path of a file of its own in
`STATE_ENV`; the worker appends one JSON object a line (`report`), and the
launcher reads them when the attempt ends (`read`). Outside the launcher
the variable is unset and nothing is written.

Records:
    {"event": "resumed", "epoch": E, "step": S}: `kerasfast.fit` resumed
        from a backup at epoch E (counted from 1), step S.
"""

from __future__ import annotations

import json
import os

STATE_ENV = "KERASFAST_WORKER_STATE"
RESUMED = "resumed"


def report(event: str, **fields) -> None:
    """Appends `{"event": event, **fields}` to this worker's state file, if it has one."""
    path = os.environ.get(STATE_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as file:
        file.write(json.dumps({"event": event, **fields}) + "\n")


def read(path) -> list[dict]:
    """The records in a worker's state file (none when it wrote none)."""
    try:
        with open(path, encoding="utf-8") as file:
            return [json.loads(line) for line in file if line.strip()]
    except FileNotFoundError:
        return []


def resumed_from(records: list[dict]) -> str | None:
    """"epoch E, step S" of the first resume among `records`, or None.

    >>> resumed_from([{"event": "resumed", "epoch": 2, "step": 8}])
    'epoch 2, step 8'
    """
    for record in records:
        if record.get("event") == RESUMED:
            return f"epoch {record['epoch']}, step {record['step']}"
    return None
