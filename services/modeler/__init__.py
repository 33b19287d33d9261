"""The modeler service: the time and memory models over all trials (ARCHITECTURE.md §5, §8)."""
