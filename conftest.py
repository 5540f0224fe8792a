"""pytest set-up for the whole repository: how nbval compares the chapters' chart outputs.

nbval applies the patterns of tests/sanitize.cfg to outputs that are strings, and compares the
rest exactly. A chart stored as JSON (a Vega-Lite mime bundle, which notebook front ends draw)
is a dict, so its data would be compared to the last digit, and a chart of a training run would
fail on any machine whose float kernels differ from the one that stored it. Here such JSON is
compared as JSON text, so the same patterns (chart data, chart ids) apply to it too. The rows
that those patterns blank out are then compared on their own, with a tolerance
(tools/chart_rows.py), except in cells tagged as drawing rows that differ between machines.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
from chart_rows import VARY_TAG, charts_difference  # noqa: E402


def pytest_configure(config) -> None:
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval is a test dependency; without it there is nothing to patch
        return
    plain_sanitize = IPyNbCell.sanitize

    def sanitize(self, value):
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        return plain_sanitize(self, value)

    IPyNbCell.sanitize = sanitize
    plain_compare = IPyNbCell.compare_outputs

    def compare_outputs(self, test, ref, skip_compare=None):
        if not plain_compare(self, test, ref, skip_compare):
            return False
        if VARY_TAG in self.cell.get("metadata", {}).get("tags", []):
            return True
        problem = charts_difference(ref, test)
        if problem is not None:
            self.comparison_traceback.append(
                f"the chart draws other rows than the stored one: {problem} (if its rows differ "
                f"between machines, tag the cell {VARY_TAG!r} and bound them with asserts)")
            return False
        return True

    IPyNbCell.compare_outputs = compare_outputs
