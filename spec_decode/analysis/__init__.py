"""Floor 2, the derived numbers: statistics, acceptance, latency, checks, drift, the lossless guard, the
cost model and the step recommendation -- functions of measured values and records."""
