"""Runs the verifiers in one long-lived interpreter, so a test binary pays Python's start-up and the imports of
pyiceberg, pyarrow, DuckDB and confluent-kafka once instead of on every read (about a second each).

usage: serve.py     (requests on stdin, responses on stdout, one JSON object per line)

Request: {"path": "<verifier script>", "args": [...]}. The script runs as if started with those arguments
(`runpy.run_path(path, run_name="__main__")` with `sys.argv` set): its module-level code and `main` are the same
code a one-shot run executes; only the imported libraries stay loaded. Response: {"ok": bool, "stdout": what it
printed, "stderr": why it failed (SystemExit's message or the traceback)}. A script's `os._exit(0)` ends the run,
not the server. The server ends when stdin closes. `sys._ratchet_serve` is set: a script may keep a costly resource
for its next run in this interpreter (spark_iceberg.py keeps its Spark session).
"""

import contextlib
import gc
import io
import json
import os
import runpy
import sys
import traceback


class _Exit(Exception):
    """A script called os._exit: the end of its run."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _exit(code: int = 0) -> None:
    raise _Exit(code)


def run(path: str, args: list) -> dict:
    out = io.StringIO()
    ok, err = True, ""
    argv, real_exit = sys.argv, os._exit
    sys.argv, os._exit = [path, *args], _exit
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except _Exit as e:
        ok = e.code == 0
    except SystemExit as e:
        if e.code not in (None, 0):
            ok, err = False, str(e.code)
    except BaseException:  # noqa: BLE001 - every failure of a verifier is reported to the test, which fails
        ok, err = False, traceback.format_exc()
    finally:
        sys.argv, os._exit = argv, real_exit
    return {"ok": ok, "stdout": out.getvalue(), "stderr": err}


def main() -> None:
    sys._ratchet_serve = True
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        response = run(request["path"], [str(a) for a in request["args"]])
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()
        # Close what the run left behind now (SQLAlchemy engines hold their SQLite connections in reference cycles),
        # not at some later run's allocation: a connection to a catalog file must not outlive the read that opened it.
        gc.collect()


if __name__ == "__main__":
    main()
    # pyarrow's thread pools can abort the interpreter at shutdown ("terminate called without an active exception");
    # every answer is written and flushed, so leave without that teardown.
    os._exit(0)
