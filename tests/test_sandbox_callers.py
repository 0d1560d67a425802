"""The task module from every kind of caller (issue 39): each caller is a real Python process,
its code unguarded (no ``if __name__ == "__main__":``), as users write reward scripts. Each must
get the right verdict, run its own code once, and have its SQL run in a worker process of its
own; a worker that cannot start is an error naming the cause, never a verdict."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import progress_sql

MARKER = "TOP-LEVEL-RAN"
GOLD = "SELECT a FROM t WHERE a > 0"
RIGHT = "SELECT a FROM t"  # the same rows as the gold
WRONG = "SELECT a FROM t WHERE a > 1"

# A user's code: prints a marker at its top level, then asks for verdicts. The database comes
# from the environment (code on stdin has no useful argv).
USER_CODE = textwrap.dedent(f"""
    print({MARKER!r}, flush=True)
    import json, os
    from progress_sql.sql import execution_match
    from progress_sql.sql.worker import shared_worker_pid
    db = os.environ["CALLER_DB"]
    verdicts = {{"right": execution_match(db, {RIGHT!r}, {GOLD!r}),
                 "wrong": execution_match(db, {WRONG!r}, {GOLD!r}),
                 "pid": os.getpid(), "worker_pid": shared_worker_pid()}}
    print("RESULT " + json.dumps(verdicts), flush=True)
""")


@pytest.fixture()
def caller_db(tmp_path: Path) -> Path:
    path = tmp_path / "caller.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER)")
    con.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])
    con.commit()
    con.close()
    return path


def _env(db: Path) -> dict[str, str]:
    """This test's progress_sql for the caller (the source tree under test, wherever it is)."""
    root = str(Path(progress_sql.__file__).resolve().parents[1])
    return {**os.environ, "CALLER_DB": str(db), "PYTHONPATH": root}


def _run(args: list[str], db: Path, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], input=stdin, cwd=cwd, env=_env(db), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _result(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr[-3000:]
    return json.loads(lines[0].removeprefix("RESULT "))


def _check(proc: subprocess.CompletedProcess) -> None:
    assert proc.stdout.count(MARKER) == 1, proc.stdout  # the caller's code ran once, not again in the worker
    got = _result(proc)
    assert (got["right"], got["wrong"]) == (True, False), (got, proc.stderr[-3000:])
    assert got["worker_pid"] not in (None, got["pid"])  # the SQL ran in a worker process
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_code_on_stdin(caller_db: Path, tmp_path: Path) -> None:
    # issue 39: the fork server re-read '<cwd>/<stdin>', the worker died, the verdict became False
    _check(_run(["-"], caller_db, tmp_path, stdin=USER_CODE))


def test_python_dash_c(caller_db: Path, tmp_path: Path) -> None:
    _check(_run(["-c", USER_CODE], caller_db, tmp_path))


def test_unguarded_script_runs_its_top_level_once(caller_db: Path, tmp_path: Path) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(USER_CODE, encoding="utf-8")
    _check(_run([str(script)], caller_db, tmp_path))


def test_notebook_like_main_without_a_file(caller_db: Path, tmp_path: Path) -> None:
    # a kernel runs cells in a fresh __main__ module that has no __file__
    cell = tmp_path / "cell.txt"
    cell.write_text(USER_CODE, encoding="utf-8")
    kernel = textwrap.dedent(f"""
        import sys, types
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(open({str(cell)!r}).read(), "<cell 1>", "exec"), main.__dict__)
    """)
    _check(_run(["-c", kernel], caller_db, tmp_path))


def test_ray_like_worker_whose_main_is_a_launcher_module(caller_db: Path, tmp_path: Path) -> None:
    # a framework's worker process: __main__ is its launcher module, which imports the user's code
    (tmp_path / "user_job.py").write_text(USER_CODE, encoding="utf-8")
    (tmp_path / "launcher.py").write_text("print('launcher started', flush=True)\nimport user_job\n", encoding="utf-8")
    proc = _run(["-m", "launcher"], caller_db, tmp_path)
    assert proc.stdout.count("launcher started") == 1, proc.stdout
    _check(proc)


def test_daemonic_process_gets_a_worker_of_its_own(caller_db: Path, tmp_path: Path) -> None:
    # a daemonic multiprocessing child may not have multiprocessing children: the sandbox used
    # to run the SQL in-process there (no hard stop, no memory cap)
    script = tmp_path / "daemon_parent.py"
    script.write_text(textwrap.dedent(f"""
        import json, multiprocessing, os

        def judge(queue):
            from progress_sql.sql import SQLPool, execution_match
            from progress_sql.sql.worker import shared_worker_pid
            db = os.environ["CALLER_DB"]
            with SQLPool(workers=2) as pool:
                rows = [r.rows for r in pool.map([(db, "SELECT count(*) FROM t"), (db, "SELECT max(a) FROM t")])]
                pooled = pool.uses_processes and os.getpid() not in pool.pids and len(pool.pids) == 2
            queue.put({{"right": execution_match(db, {RIGHT!r}, {GOLD!r}),
                        "wrong": execution_match(db, {WRONG!r}, {GOLD!r}),
                        "pid": os.getpid(), "worker_pid": shared_worker_pid(), "pooled": pooled, "rows": rows,
                        "daemon": multiprocessing.current_process().daemon}})

        if __name__ == "__main__":
            print({MARKER!r}, flush=True)
            queue = multiprocessing.Queue()
            child = multiprocessing.Process(target=judge, args=(queue,), daemon=True)
            child.start()
            print("RESULT " + json.dumps(queue.get(timeout=100)), flush=True)
            child.join()
    """), encoding="utf-8")
    proc = _run([str(script)], caller_db, tmp_path)
    _check(proc)
    got = _result(proc)
    assert got["daemon"] and got["pooled"] and got["rows"] == [[[3]], [[3]]], got


TRL_CODE = textwrap.dedent(f"""
    print({MARKER!r}, flush=True)
    import json, os
    from progress_sql.integrations.trl import reward_function
    db = os.environ["CALLER_DB"]
    reward = reward_function("oneshot")
    texts = ["<think>all rows</think><sql>{RIGHT}</sql>", "<think>some rows</think><sql>{WRONG}</sql>"]
    print("RESULT " + json.dumps(reward(["q", "q"], texts, db_path=[db, db], gold_sql=[{GOLD!r}] * 2)), flush=True)
""")

VERL_CODE = textwrap.dedent(f"""
    print({MARKER!r}, flush=True)
    import json, os
    from progress_sql.integrations.verl import compute_score
    info = {{"db_path": os.environ["CALLER_DB"]}}
    scores = [compute_score("progress_sql", f"<think>r</think><sql>{{sql}}</sql>", {GOLD!r}, info)
              for sql in ({RIGHT!r}, {WRONG!r})]
    print("RESULT " + json.dumps(scores), flush=True)
""")


def test_trl_reward_function_from_an_unguarded_script_on_stdin(caller_db: Path, tmp_path: Path) -> None:
    from progress_sql.integrations.trl import reward_function

    proc = _run(["-"], caller_db, tmp_path, stdin=TRL_CODE)
    assert proc.stdout.count(MARKER) == 1, proc.stdout
    right, wrong = _result(proc)
    texts = [f"<think>all rows</think><sql>{RIGHT}</sql>", f"<think>some rows</think><sql>{WRONG}</sql>"]
    assert [right, wrong] == reward_function("oneshot")(["q", "q"], texts, db_path=[str(caller_db)] * 2,
                                                        gold_sql=[GOLD] * 2)
    assert right > wrong


def test_verl_compute_score_from_an_unguarded_script_on_stdin(caller_db: Path, tmp_path: Path) -> None:
    # issue 39: verl scored the right answer as the wrong one (0.4 and 0.4)
    from progress_sql.integrations.verl import compute_score

    proc = _run(["-"], caller_db, tmp_path, stdin=VERL_CODE)
    assert proc.stdout.count(MARKER) == 1, proc.stdout
    right, wrong = _result(proc)
    assert (right["correct"], wrong["correct"]) == (1.0, 0.0), (right, wrong)
    assert right["score"] > wrong["score"]
    info = {"db_path": str(caller_db)}
    assert right == compute_score("progress_sql", f"<think>r</think><sql>{RIGHT}</sql>", GOLD, info)


# ----------------------------------------------------------------------------- no worker, no verdict
BROKEN_START = textwrap.dedent(f"""
    import json, os, sys
    from progress_sql.integrations.verl import compute_score
    from progress_sql.sql import SQLPool, SandboxUnavailable, execution_match
    db = os.environ["CALLER_DB"]
    {{setup}}
    calls = {{
        "execution_match": lambda: execution_match(db, {RIGHT!r}, {GOLD!r}),
        "compute_score": lambda: compute_score("x", "<think>r</think><sql>{RIGHT}</sql>", {GOLD!r}, {{"db_path": db}}),
        "pool": lambda: SQLPool(workers=1).map([(db, "SELECT 1")]),
    }}
    for name, call in calls.items():
        try:
            print("RETURNED", name, call(), flush=True)
        except SandboxUnavailable as err:
            print("RAISED", name, err, flush=True)
""")


@pytest.mark.parametrize(("setup", "cause"), [
    # the worker's interpreter is not there
    ("sys.executable = '/nowhere/python3'", "/nowhere/python3"),
    # the worker dies while importing (a broken package shadows a dependency in the child only)
    ("os.makedirs('shadow/sqlglot', exist_ok=True); "
     "open('shadow/sqlglot/__init__.py', 'w').write('raise ImportError(\"this sqlglot is broken\")'); "
     "os.environ['PYTHONPATH'] += os.pathsep + os.path.abspath('shadow')",
     "ImportError: this sqlglot is broken"),
], ids=["no_interpreter", "dies_while_importing"])
def test_a_worker_that_cannot_start_is_an_error_naming_the_cause(caller_db: Path, tmp_path: Path, setup: str,
                                                                 cause: str) -> None:
    proc = _run(["-"], caller_db, tmp_path, stdin=BROKEN_START.replace("{setup}", setup))
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if line.startswith("RETURNED")], proc.stdout
    raised = [line for line in lines if line.startswith("RAISED")]
    assert [line.split()[1] for line in raised] == ["execution_match", "compute_score", "pool"], proc.stdout
    assert all(cause in line for line in raised), proc.stdout


def test_a_worker_that_imported_another_copy_of_the_package_refuses_to_serve(caller_db: Path, tmp_path: Path,
                                                                             monkeypatch) -> None:
    from progress_sql.sql import SandboxUnavailable
    from progress_sql.sql.worker import Worker

    other = tmp_path / "elsewhere" / "progress_sql" / "__init__.py"  # the copy the caller claims to be
    monkeypatch.setattr(progress_sql, "__file__", str(other))
    worker = Worker()
    try:
        with pytest.raises(SandboxUnavailable, match=f"not the caller's {other}"):
            worker.run([(caller_db, "SELECT 1")])
        assert worker.pid is None  # nothing left running
    finally:
        worker.close()


def test_a_forked_copy_of_the_caller_gets_a_worker_of_its_own(caller_db: Path, tmp_path: Path) -> None:
    # Sharing the parent's socket, two processes would read each other's results; and the copy
    # must not stop the parent's worker when it exits.
    code = textwrap.dedent(f"""
        import json, os, sys
        from progress_sql.sql import execution_match
        from progress_sql.sql.worker import shared_worker_pid
        db = os.environ["CALLER_DB"]

        def judged():
            return execution_match(db, {RIGHT!r}, {GOLD!r}) and not execution_match(db, {WRONG!r}, {GOLD!r})

        first = judged()
        parent_worker = shared_worker_pid()
        child = os.fork()
        if child == 0:
            print("CHILD " + json.dumps({{"ok": judged(), "worker": shared_worker_pid()}}), flush=True)
            sys.exit(0)  # a normal exit: the interpreter's exit handlers run in the copy too
        os.waitpid(child, 0)
        print("RESULT " + json.dumps({{"ok": first and judged(), "worker": shared_worker_pid(),
                                       "before": parent_worker}}), flush=True)
    """)
    proc = _run(["-c", code], caller_db, tmp_path)
    child = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("CHILD "))[6:])
    parent = _result(proc)
    assert child["ok"] and parent["ok"], proc.stdout + proc.stderr[-3000:]
    assert child["worker"] not in (None, parent["before"])  # its own worker
    assert parent["worker"] == parent["before"]  # the parent's worker lived on, untouched
