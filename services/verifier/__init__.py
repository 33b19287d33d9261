"""The verifier service: re-runs top candidates against the baseline and decides (ARCHITECTURE.md §5)."""
