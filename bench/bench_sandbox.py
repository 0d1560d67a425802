"""Sandbox throughput and how late runaway queries are stopped.

On a generated database (customers, products, orders: ~50k rows, in a temporary folder):

- queries/s of a few hundred varied SELECTs run one by one in this thread, run one by one
  with the connection cache cleared before each (the cost of opening per call), through
  ``SQLPool`` (worker processes) and, for comparison, through a thread pool of the same size;
  each the median of ``--repeats`` passes, with the ratios to the single-threaded figure;
- the runaway queries (an endless recursive CTE, a five-way cartesian product) with a 1.0 s
  limit: lateness = elapsed - limit, median and max of ``--runaway-repeats`` runs;
- a panel of queries that try to take memory or run inside one SQLite operation (a 900M-char
  printf, a 450 MB random blob, a string doubled in a recursive CTE, a growing group_concat,
  a sort of wide rows) with a ``--bomb-timeout`` limit: each alone in a fresh process through
  ``execute_isolated`` (as rollouts judge policy SQL), then all through ``SQLPool`` in one: per
  query the error kind, elapsed and peak memory (RSS, the caller's and its workers'); then the
  worst overrun (elapsed - limit) and the largest peak;
- what a worker's start costs: the time to the first answer of a new ``Worker`` (the first in a
  fresh process, then later ones), and of the query after a hard stop, sent at once or after a
  pause (a rollout generates between queries: the replacement starts during the pause).

    python bench/bench_sandbox.py [--workers N] [--queries 300] [--repeats 3] [--only-bombs] [--only-starts]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import resource
import sqlite3
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from progress_sql.params import SandboxSettings, default_settings
from progress_sql.sql import SQLPool, execute, execute_isolated
from progress_sql.sql.sandbox import clear_connection_cache
from progress_sql.sql.worker import Worker

RUNAWAYS = {
    "recursive CTE": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
    "5-way cartesian": "SELECT count(*) FROM products a, products b, products c, products d, products e",
}
BOMBS = {
    "printf 900M chars": "SELECT length(printf('%.*c', 900000000, 'x'))",
    "instr quadratic": ("SELECT instr(replace(hex(zeroblob(2000000)), '0', 'a') || 'b', "
                        "replace(hex(zeroblob(500000)), '0', 'a') || 'b')"),
    "randomblob 450 MB": "SELECT length(hex(randomblob(450000000)))",
    "doubling CTE": "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) SELECT max(length(s)) FROM r",
    "group_concat": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 50000000) "
                    "SELECT length(group_concat(printf('%099d', i))) FROM r",
    "sort wide rows": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 3000000) "
                      "SELECT length(b) FROM (SELECT zeroblob(2000) || i AS b FROM r) ORDER BY b DESC LIMIT 1",
}
CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Perth", "Quito", "Accra", "Turin", "Osaka", "Cork"]


TEMPLATES = [
    "SELECT name, age FROM customers WHERE id = {customer}",
    "SELECT count(*) FROM customers WHERE city = '{city}' AND age > {age}",
    "SELECT title, price FROM products WHERE price BETWEEN {low} AND {high} ORDER BY price DESC LIMIT 10",
    "SELECT c.name, sum(o.quantity) FROM customers AS c JOIN orders AS o ON c.id = o.customer_id "
    "WHERE c.id < {few} GROUP BY c.id",
    "SELECT category, avg(price), count(*) FROM products GROUP BY category HAVING count(*) > {group_size}",
    "SELECT city, count(*) FROM customers WHERE age < {age} GROUP BY city ORDER BY count(*) DESC",
    "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM orders WHERE product_id = {product})",
    "SELECT p.title FROM products AS p WHERE p.price > (SELECT avg(price) FROM products) AND p.category = '{category}'",
    "SELECT count(*) FROM orders WHERE day LIKE '2024-{month:02d}-%'",
    "SELECT city FROM customers WHERE age > {old} INTERSECT SELECT city FROM customers WHERE age < {young}",
    "SELECT DISTINCT o.product_id FROM orders AS o WHERE o.quantity = {quantity} AND o.customer_id < {many}",
    "SELECT p.category, sum(o.quantity * p.price) AS revenue FROM orders AS o JOIN products AS p "
    "ON o.product_id = p.id WHERE o.day >= '2024-{month:02d}-01' GROUP BY p.category ORDER BY revenue DESC",
]


def build_database(folder: Path, seed: int) -> Path:
    """customers 9,000, products 1,000, orders 40,000 rows."""
    rng = random.Random(seed)
    path = folder / "bench.sqlite"
    con = sqlite3.connect(path)
    con.executescript(
        """
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, age INTEGER, joined TEXT);
        CREATE TABLE products (id INTEGER PRIMARY KEY, title TEXT, category TEXT, price REAL);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                             product_id INTEGER REFERENCES products(id), quantity INTEGER, day TEXT);
        CREATE INDEX orders_customer ON orders(customer_id);
        """
    )
    customers = [
        (i, f"customer {i}", rng.choice(CITIES), rng.randint(18, 90), f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-15")
        for i in range(1, 9001)
    ]
    products = [(i, f"product {i}", f"cat{i % 12}", round(rng.uniform(1, 500), 2)) for i in range(1, 1001)]
    orders = [
        (i, rng.randint(1, 9000), rng.randint(1, 1000), rng.randint(1, 5),
         f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        for i in range(1, 40001)
    ]
    con.executemany("INSERT INTO customers VALUES (?,?,?,?,?)", customers)
    con.executemany("INSERT INTO products VALUES (?,?,?,?)", products)
    con.executemany("INSERT INTO orders VALUES (?,?,?,?,?)", orders)
    con.commit()
    con.close()
    return path


def make_queries(n: int, seed: int) -> list[str]:
    """Varied SELECTs: lookups, filters, joins, grouping, ordering, subqueries, set operations."""
    rng = random.Random(seed)

    def params() -> dict[str, object]:
        return {
            "customer": rng.randint(1, 9000), "city": rng.choice(CITIES), "age": rng.randint(18, 80),
            "low": rng.randint(1, 200), "high": rng.randint(201, 500), "few": rng.randint(10, 400),
            "group_size": rng.randint(50, 90), "product": rng.randint(1, 1000), "category": f"cat{rng.randint(0, 11)}",
            "month": rng.randint(1, 12), "old": rng.randint(60, 89), "young": rng.randint(19, 30),
            "quantity": rng.randint(1, 5), "many": rng.randint(100, 2000),
        }

    return [rng.choice(TEMPLATES).format(**params()) for _ in range(n)]


def _execute_job(job: tuple[str, str]) -> object:
    return execute(*job)


def timed(run, repeats: int) -> float:
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def throughput(db: Path, queries: list[str], workers: int, repeats: int) -> dict[str, float]:
    """Queries per second of each way of running ``queries``."""
    jobs = [(str(db), q) for q in queries]
    seconds = {"single thread, cached connection": timed(lambda: [execute(db, q) for q in queries], repeats)}

    def reopen_each() -> None:
        for q in queries:
            clear_connection_cache()
            execute(db, q)

    seconds["single thread, open per query"] = timed(reopen_each, repeats)
    execute_isolated(db, queries[0])  # start the worker: policy SQL in a rollout goes this way
    seconds["one by one, supervised worker"] = timed(lambda: [execute_isolated(db, q) for q in queries], repeats)
    with SQLPool(workers=workers) as pool:
        pool.map(jobs)  # start the workers and warm their connections
        seconds[f"SQLPool, {workers} processes"] = timed(lambda: pool.map(jobs), repeats)
    with ThreadPoolExecutor(max_workers=workers) as threads:
        list(threads.map(_execute_job, jobs))
        seconds[f"thread pool, {workers} threads (comparison)"] = timed(
            lambda: list(threads.map(_execute_job, jobs)), repeats
        )
    return {name: len(queries) / s for name, s in seconds.items()}


def _peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # kB on Linux


def _one_bomb(db: str, sql: str, timeout_s: float) -> tuple[str, float, float]:
    """In a fresh process, as policy SQL runs (``execute_isolated``: a supervised worker):
    (error kind, elapsed s, the larger peak RSS in MB of this process and its worker)."""
    execute_isolated(db, "SELECT 1")  # the worker starts, as before a rollout's first verdict
    start = time.monotonic()
    result = execute_isolated(db, sql, timeout_s=timeout_s)
    elapsed = time.monotonic() - start
    return result.error or "ok", elapsed, max(_peak_mb(), _descendants_peak_mb())


def _descendants_peak_mb() -> float:
    """The largest peak RSS (VmHWM) among this process's descendants, read while they live (a
    worker outlives no query here, so RUSAGE_CHILDREN would not have it yet)."""
    import psutil  # noqa: PLC0415

    peaks = [0.0]
    for proc in psutil.Process().children(recursive=True):
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        peaks += [int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
    return max(peaks)


def _pooled_bombs(db: str, sqls: list[str], timeout_s: float, workers: int) -> tuple[list[tuple[str, float]], float]:
    """In a fresh process: each query's (error kind, elapsed s) through SQLPool, and the workers' peak RSS."""
    with SQLPool(workers=workers) as pool:
        results = pool.map([(db, q) for q in sqls], timeout_s=timeout_s)
        peak = _descendants_peak_mb()
    return [(r.error or "ok", r.elapsed_s) for r in results], peak


def _child(conn, fn, args) -> None:
    conn.send(fn(*args))
    conn.close()


def _in_fresh_process(fn, *args):
    """``fn(*args)`` in a new process: its peak memory is its own."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    proc = context.Process(target=_child, args=(send, fn, args))
    proc.start()
    out = receive.recv()
    proc.join()
    return out


def bombs(db: Path, timeout_s: float, workers: int) -> None:
    """The panel of BOMBS, alone and pooled: error kinds, elapsed, peak memory."""
    cfg = default_settings().sandbox
    print(f"queries that take memory or run inside one operation, limit {timeout_s:g} s "
          f"(max_value_bytes {cfg.max_value_bytes:,}, max_memory_mb {cfg.max_memory_mb}, "
          f"hard_stop_grace_s {cfg.hard_stop_grace_s:g}, worker_memory_mb {cfg.worker_memory_mb}):")
    overruns, peaks = [], []
    for name, sql in BOMBS.items():
        kind, elapsed, peak = _in_fresh_process(_one_bomb, str(db), sql, timeout_s)
        overruns.append(elapsed - timeout_s)
        peaks.append(peak)
        print(f"  alone   {name:<18} {kind:<14} {elapsed:6.2f} s   peak {peak:7.0f} MB")
    rows, pool_peak = _in_fresh_process(_pooled_bombs, str(db), list(BOMBS.values()) * 2, timeout_s, workers)
    for name, (kind, elapsed) in zip(list(BOMBS) * 2, rows):
        overruns.append(elapsed - timeout_s)
        print(f"  pooled  {name:<18} {kind:<14} {elapsed:6.2f} s")
    print(f"  pooled: {workers} worker processes, each query twice; the workers' largest peak {pool_peak:.0f} MB")
    print(f"worst overrun {max(overruns):+.2f} s; largest peak {max(peaks + [pool_peak]):.0f} MB")


def _answer_s(worker: Worker, db: str) -> float:
    start = time.perf_counter()
    result, = worker.run([(db, "SELECT 1")])
    if not result.ok:
        raise SystemExit(f"worker failed: {result.message}")
    return time.perf_counter() - start


def _first_start(db: str) -> float:
    worker = Worker()
    try:
        return _answer_s(worker, db)
    finally:
        worker.close()


def worker_starts(db: Path, repeats: int) -> None:
    """The time to a new worker's first answer, and to the answer after a hard stop."""
    print(f"worker start, time to the first answer (median of {repeats}; first: a fresh process each):")
    firsts = [_in_fresh_process(_first_start, str(db)) for _ in range(repeats)]
    later = []
    for _ in range(repeats):
        worker = Worker()
        later.append(_answer_s(worker, str(db)))
        worker.close()
    print(f"  first worker of a process   median {statistics.median(firsts) * 1e3:7.0f} ms   max {max(firsts) * 1e3:7.0f} ms")
    print(f"  a later worker              median {statistics.median(later) * 1e3:7.0f} ms   max {max(later) * 1e3:7.0f} ms")
    worker = Worker(SandboxSettings(hard_stop_grace_s=0.2))
    _answer_s(worker, str(db))
    for pause in (0.0, 1.0):
        after = []
        for _ in range(repeats):
            stopped, = worker.run([(str(db), BOMBS["instr quadratic"])], timeout_s=0.3)
            if stopped.error != "timeout":
                raise SystemExit(f"expected a hard stop, got {stopped.error}: {stopped.message}")
            time.sleep(pause)
            after.append(_answer_s(worker, str(db)))
        print(f"  after a hard stop, {pause:g} s later  median {statistics.median(after) * 1e3:7.0f} ms   "
              f"max {max(after) * 1e3:7.0f} ms")
    worker.close()


def main() -> None:
    cfg = default_settings().sandbox
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=cfg.workers)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runaway-repeats", type=int, default=5)
    parser.add_argument("--runaway-timeout", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bomb-timeout", type=float, default=2.0)
    parser.add_argument("--only-bombs", action="store_true", help="only the panel of memory and one-operation queries")
    parser.add_argument("--only-starts", action="store_true", help="only what a worker's start costs")
    args = parser.parse_args()
    if args.only_starts:
        with tempfile.TemporaryDirectory() as tmp:
            worker_starts(build_database(Path(tmp), args.seed), args.repeats)
        return
    if args.only_bombs:
        with tempfile.TemporaryDirectory() as tmp:
            bombs(build_database(Path(tmp), args.seed), args.bomb_timeout, args.workers)
        return

    with tempfile.TemporaryDirectory() as tmp:
        db = build_database(Path(tmp), args.seed)
        rng = random.Random(args.seed)
        workloads = {
            f"varied ({args.queries})": make_queries(args.queries, args.seed),
            f"point lookups ({args.lookups})": [
                f"SELECT name, age FROM customers WHERE id = {rng.randint(1, 9000)}" for _ in range(args.lookups)
            ],
        }
        for queries in workloads.values():
            failed = [r.message for r in (execute(db, q) for q in queries) if not r.ok]
            if failed:
                raise SystemExit(f"{len(failed)} benchmark queries failed, e.g. {failed[0]}")
        with sqlite3.connect(db) as con:
            rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("customers", "products", "orders"))
        con.close()
        print(f"database: {db.stat().st_size / 1e6:.1f} MB, {rows:,} rows; {os.cpu_count()} CPUs; "
              f"workers={args.workers}; median of {args.repeats} passes")
        figures = {name: throughput(db, queries, args.workers, args.repeats) for name, queries in workloads.items()}
        print(f"{'queries/s (ratio to single thread)':<44}" + "".join(f"{name:>26}" for name in figures))
        for way in next(iter(figures.values())):
            cells = []
            for per_way in figures.values():
                base = next(iter(per_way.values()))
                cells.append(f"{per_way[way]:>17.0f} ({per_way[way] / base:4.2f}x)")
            print(f"{way:<44}" + "".join(cells))

        print(f"runaway queries, limit {args.runaway_timeout:g} s, "
              f"lateness = elapsed - limit over {args.runaway_repeats} runs:")
        for name, sql in RUNAWAYS.items():
            late = []
            for _ in range(args.runaway_repeats):
                start = time.monotonic()
                result = execute(db, sql, timeout_s=args.runaway_timeout)
                late.append(time.monotonic() - start - args.runaway_timeout)
                if result.error != "timeout":
                    raise SystemExit(f"{name}: expected a timeout, got {result.error}: {result.message}")
            print(f"  {name:<18} median {statistics.median(late) * 1e3:6.1f} ms   max {max(late) * 1e3:6.1f} ms")
        bombs(db, args.bomb_timeout, args.workers)
        worker_starts(db, args.repeats)


if __name__ == "__main__":
    main()
