"""Files that readers see whole or not at all.

:func:`write_text_atomic` writes to a temporary file in the target's folder, flushes it to
disk and renames it over the target: a crash (or a reader racing the writer) finds the old
file or the new one, never half of one. Used for stage results, evaluation outputs, the
pipeline's stage records and the MLflow run-id file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, creating its folder; returns the path.

    Example:

    >>> import pathlib, tempfile
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out" / "summary.json"
    >>> write_text_atomic(target, '{"step": 3}').read_text()
    '{"step": 3}'
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())  # on disk before the rename makes it visible
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
