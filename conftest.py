"""pytest set-up for the whole repository: how nbval compares the chapters' chart outputs.

nbval applies the patterns of tests/sanitize.cfg to outputs that are strings, and compares the
rest exactly. A chart stored as JSON (a Vega-Lite mime bundle, which notebook front ends draw)
is a dict, so its data would be compared to the last digit, and a chart of a training run would
fail on any machine whose float kernels differ from the one that stored it. Here such JSON is
compared as JSON text, so the same patterns (chart data, chart ids) apply to it too.
"""

import json


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
