"""Tables, CSV and the latency plot of one ``make bench`` run.

Every measured row is a list of samples in milliseconds. A :class:`Report`
collects the rows of all sections, prints each section as a table (p50, p95,
mean, n), and at the end writes ``build/bench/samples.csv`` (one line per
sample), ``build/bench/summary.csv`` (one line per row) and
``build/bench/latency.png`` (box plots of the distributions, log scale).
"""

from __future__ import annotations

import csv
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT_DIR = Path(os.environ.get("BENCH_OUT", Path(__file__).resolve().parents[1] / "build" / "bench"))


def percentile(samples: list[float], q: float) -> float:
    """Returns the q-quantile (0..1) of samples by nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def timed(fn: Callable[[], Awaitable[Any]], rounds: int, *, before: Callable[[], Awaitable[Any]] | None = None, warmup: bool = True) -> list[float]:
    """Runs ``fn`` ``rounds`` times (after one warm-up); returns wall times in ms.

    Args:
        fn: The measured call.
        rounds: Samples to take.
        before: Awaited before each sample, outside the timing (e.g. wait for
            the pool to refill).
        warmup: Run one unmeasured call first.
    """
    if warmup:
        await attempt(fn)
    out = []
    for _ in range(rounds):
        if before is not None:
            await before()
        start = time.perf_counter()
        if await attempt(fn):
            out.append((time.perf_counter() - start) * 1000)
    return out


#: Samples that failed since the last :meth:`Report.add` (counted into its note).
_failed: list[str] = []


async def attempt(fn: Callable[[], Awaitable[Any]]) -> bool:
    """Awaits ``fn``; a failure (a loaded engine timing out) is counted, not raised."""
    try:
        await fn()
    except Exception as exc:  # noqa: BLE001 - reported in the row's note
        _failed.append(f"{exc.__class__.__name__}: {str(exc)[:160]}")
        return False
    return True


@dataclass
class Row:
    """One measured row: samples in ms (or a single value with a unit)."""

    section: str
    name: str
    samples: list[float]
    note: str = ""

    @property
    def p50(self) -> float:
        return percentile(self.samples, 0.5)

    @property
    def p95(self) -> float:
        return percentile(self.samples, 0.95)


@dataclass
class Report:
    """All rows of one run, printed per section."""

    rows: list[Row] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def add(self, section: str, name: str, samples: list[float], note: str = "") -> Row:
        if _failed:
            note = f"{note}; {len(_failed)} failed (first: {_failed[0][:90]})".lstrip("; ")
            _failed.clear()
        row = Row(section, name, samples or [float("nan")], note)
        self.rows.append(row)
        return row

    def get(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)

    def table(self, section: str, title: str) -> None:
        """Prints the rows of ``section`` as one table."""
        rows = [r for r in self.rows if r.section == section]
        width = max([len(r.name) for r in rows] + [40])
        self.say(f"\n## {title}")
        self.say(f"{'row':{width}} {'p50 ms':>9} {'p95 ms':>9} {'mean ms':>9} {'n':>4}  note")
        for r in rows:
            self.say(f"{r.name:{width}} {r.p50:9.1f} {r.p95:9.1f} {statistics.fmean(r.samples):9.1f} {len(r.samples):4d}  {r.note}")

    def ratio(self, label: str, value: float, target: float | None = None, *, at_most: bool = True) -> None:
        """Prints one ratio, with its target and whether it was met."""
        verdict = ""
        if target is not None:
            met = value <= target if at_most else value >= target
            verdict = f"   target {'<=' if at_most else '>='} {target:g}x: {'met' if met else 'NOT met'}"
        self.say(f"  {label:66} {value:8.2f}x{verdict}")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)

    def write(self) -> None:
        """Writes the CSVs, the plot and the printed text under :data:`OUT_DIR`."""
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        with open(OUT_DIR / "samples.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["section", "row", "sample", "ms"])
            for r in self.rows:
                for i, s in enumerate(r.samples):
                    w.writerow([r.section, r.name, i, f"{s:.3f}"])
        with open(OUT_DIR / "summary.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["section", "row", "p50_ms", "p95_ms", "mean_ms", "n", "note"])
            for r in self.rows:
                w.writerow([r.section, r.name, f"{r.p50:.3f}", f"{r.p95:.3f}", f"{statistics.fmean(r.samples):.3f}", len(r.samples), r.note])
        (OUT_DIR / "report.txt").write_text("\n".join(self.lines) + "\n", "utf-8")
        self._plot()

    def _plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if len(r.samples) > 1]
        fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.5))
        ax.boxplot([r.samples for r in rows], vert=False, whis=(5, 95), showfliers=True)
        ax.set_yticks(range(1, len(rows) + 1), [f"{r.section}: {r.name}" for r in rows], fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale); whiskers p5-p95")
        ax.invert_yaxis()
        ax.grid(axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(OUT_DIR / "latency.png", dpi=110)
        plt.close(fig)
