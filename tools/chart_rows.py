"""The rows a stored chart draws, and whether a fresh run of its cell draws the same ones.

nbval compares a chart's spec with the data blanked out (tests/sanitize.cfg), because a chart of
a training run or of a timing differs from machine to machine. The rows of every other chart are
compared here, number by number with a tolerance far above float rounding (another CPU's kernels
move a float32 result in its sixth or seventh digit), so a chart whose rows came from an older
run, or from another computation than its cell's, fails. A cell whose chart rows differ
between machines (a training run, a timing, weights near a chart's cut-off) carries the cell
tag VARY_TAG; the cell, or the one that computes the rows, bounds them with asserts.
"""

import csv
import io
import json
import math
from typing import Any

VEGA_LITE_MIME = "application/vnd.vegalite.v5+json"  # the book's; not imported, to keep torch out
VARY_TAG = "chart-rows-vary"
REL_TOL, ABS_TOL = 1e-3, 1e-5  # float32 rounding is about 1e-7 relative


def chart_rows(spec: Any) -> list[list[dict]]:
    """Every inline data set of a Vega-Lite spec as a list of rows, in the order of the places
    that use them (keys in sorted order, as a stored notebook has them; a named data set where
    its name is used); CSV text (the attention charts) is read into rows of strings."""
    named = spec.get("datasets", {}) if isinstance(spec, dict) else {}
    found: list[list[dict]] = []
    used: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("values"), list | str):
                found.append(as_rows(node["values"]))
            elif node.get("name") in named and set(node) <= {"name", "format"}:
                used.add(node["name"])
                found.append(as_rows(named[node["name"]]))
            for key in sorted(node):
                if key not in ("datasets", "values"):
                    visit(node[key])
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(spec)
    found.extend(as_rows(named[name]) for name in sorted(named) if name not in used)
    return found


def as_rows(values: list | str) -> list[dict]:
    if isinstance(values, str):
        return list(csv.DictReader(io.StringIO(values)))
    return [row if isinstance(row, dict) else {"value": row} for row in values]


def as_number(value: Any) -> float | None:
    """The number a cell holds: a JSON number, or CSV text that reads as one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def rounding_unit(value: Any) -> float:
    """One unit in the last decimal that a stored number shows (0.001 for 0.123): a number the
    cell rounded may round the other way on another machine."""
    text = value if isinstance(value, str) else repr(value)
    if "e" in text.lower() or "." not in text:
        return 0.0
    return 10.0 ** -len(text.split(".")[1])


def same_value(stored: Any, fresh: Any) -> bool:
    a, b = as_number(stored), as_number(fresh)
    if a is None or b is None:
        return stored == fresh
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    tolerance = max(REL_TOL * max(abs(a), abs(b)), ABS_TOL, 1.01 * rounding_unit(stored))
    return abs(a - b) <= tolerance


def rows_difference(stored: Any, fresh: Any) -> str | None:
    """None when two specs draw the same rows (numbers within the tolerance), else the first
    difference, in one line."""
    old, new = chart_rows(stored), chart_rows(fresh)
    if len(old) != len(new):
        return f"{len(old)} data sets stored, {len(new)} drawn now"
    for number, (old_rows, new_rows) in enumerate(zip(old, new, strict=True)):
        if len(old_rows) != len(new_rows):
            return f"data set {number}: {len(old_rows)} rows stored, {len(new_rows)} drawn now"
        for index, (a, b) in enumerate(zip(old_rows, new_rows, strict=True)):
            if set(a) != set(b):
                return f"data set {number}, row {index}: fields {sorted(a)} stored, {sorted(b)} now"
            for field in a:
                if not same_value(a[field], b[field]):
                    return (f"data set {number}, row {index}, {field!r}: {a[field]!r} stored, "
                            f"{b[field]!r} drawn now")
    return None


def chart_specs(outputs: list) -> list[dict]:
    """The Vega-Lite specs among a cell's outputs (a stored one may be JSON text)."""
    specs = [output["data"][VEGA_LITE_MIME] for output in outputs
             if VEGA_LITE_MIME in output.get("data", {})]
    return [json.loads(spec) if isinstance(spec, str) else spec for spec in specs]


def charts_difference(stored_outputs: list, fresh_outputs: list) -> str | None:
    """The first difference between the rows of a cell's stored charts and its fresh ones."""
    stored, fresh = chart_specs(stored_outputs), chart_specs(fresh_outputs)
    for old, new in zip(stored, fresh, strict=False):  # how many charts: nbval's own comparison
        problem = rows_difference(old, new)
        if problem is not None:
            return problem
    return None
