"""``harness.tune``: how good its split is and what finding it costs.

One ``tune()`` per asv run (``setup_cache``, in its own process); both tracks
read its record, so the costly part runs once. On the ci grid it tunes two
emulated devices with short verification windows: the efficiency is that of
the emulated case, the seconds are the CI machine's.
"""

from __future__ import annotations

from . import common

GRID = common.current_grid()


class Tuner:
    """``harness.tune(GRID.tune_model, ...)``: the most samples/s split of the grid's tuner devices."""

    timeout = GRID.timeout

    def setup_cache(self):
        return common.gridrun().tune_record(common.current_grid())

    setup_cache.timeout = GRID.setup_timeout

    def setup(self, record):
        if "error" in record:
            raise NotImplementedError(record["error"])
        common.refuse_host_bound(record.get("host_bound"), "harness.tune's profiles and verification")
        self.tuned = record["verify"]["tuned"]
        if self.tuned["status"] != "complete":
            raise RuntimeError(f"the tuned split {self.tuned['batches']} did not run: {self.tuned['error']}")

    def track_efficiency(self, record):
        return self.tuned["efficiency"]

    track_efficiency.unit = "measured / sum of solo"

    def track_tuning_seconds(self, record):
        return record["seconds"]["total"]

    track_tuning_seconds.unit = "s"
