"""``make bench``: every section in one run; tables on stdout, CSV and PNG under build/bench/.

Logs are silenced (the service's structlog output, library loggers and gRPC
core's own log lines), so only the tables print; the hosted MCP servers'
stderr goes to build/bench/mcp-servers.log. The tables are also written to
build/bench/report.txt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import structlog


def _quiet() -> None:
    # Libraries that set their own logger levels (bm25s logs at DEBUG) are
    # silenced too: nothing but the tables reaches the terminal.
    logging.disable(logging.CRITICAL)
    # Loggers are cached on first use as the service configures them (logging.configure_logging):
    # an uncached module logger binds a new logger for every line, even a filtered one (5 µs each).
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL), cache_logger_on_first_use=True)


def main() -> None:
    """Runs every section, writes the files, prints where."""
    # gRPC core logs ("Got goaway") to stderr unless told otherwise; read at its import.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # The run-store and noisy-neighbour sections' sample counts, within the 5-minute budget. With 2
    # normal execs per client a phase of 8 clients has 16 samples and its nearest-rank p99 is their
    # maximum: the noisy/alone ratio of two such maxima spread 1.33-2.26x (p5-p95) over one run's
    # distributions, whose ratio was 1.68x; 6 per client (48 samples) narrow it to 1.34-2.05x
    # (bench/README.md, noisy neighbours: the short sample).
    os.environ.setdefault("BENCH_STORE_ROUNDS", "9")
    os.environ.setdefault("BENCH_NORMAL_EXECS", "6")
    from bench import catalog_search, exec_latency, final_value_rss, noisy_neighbour, run_store
    from bench._report import OUT_DIR, Report

    _quiet()
    started = time.perf_counter()
    report = Report()
    asyncio.run(exec_latency.run(report))
    report.write()
    print("\n## Catalog search (500 tools)", flush=True)
    catalog_search.main()
    print("\n## Run store (memory:, SQLite, PostgreSQL)", flush=True)
    asyncio.run(run_store.main())
    print("\n## Noisy neighbours (issue 11)", flush=True)
    asyncio.run(noisy_neighbour.main())
    print("\n## Big final values: service memory (issue 11)", flush=True)
    asyncio.run(final_value_rss.main())
    print(f"\nwrote {OUT_DIR}/samples.csv, summary.csv, report.txt, latency.png ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
