"""The proposer service: chooses what to try next (ARCHITECTURE.md §5)."""
