"""A short soak in CI (45 s; `scripts/soak` runs the 10-minute one): mixed traffic with no
failed request, no RSS growth past 5% after a 15-second warm-up, no fd leak (soak.py)."""

import harness
import soak

DURATION_S = 45
WARMUP_S = 15
INTERVAL_S = 3


def test_short_soak_loses_nothing_and_leaks_nothing():
    lz = harness.start("--enable-prefill-logprobs", name="soak-short")
    try:
        s = soak.Soak(lz, DURATION_S, WARMUP_S, interval_s=INTERVAL_S)
        summary = s.run(verbose=False)
    finally:
        lz.stop()
    harness.report("soak_short", {k: v for k, v in summary.items() if k != "failures"})
    soak.check(summary)
