"""airspeed-velocity (asv) suites for relu2-bench; see bench_relu2 and asv.conf.json at the repository root."""
