"""SIMULATOR: analytic LLM-training cluster model behind the `sim` launcher backend and the benchmarks.

Everything here is simulated (datasheet peaks, textbook formulas, seeded hidden corrections and noise); no
output of this package is a measurement.
"""

from infrarsi.sim.scenarios import SCENARIOS, Scenario, SimOutcome, enumerate_scenario, get_scenario, oracle

__all__ = ["SCENARIOS", "Scenario", "SimOutcome", "enumerate_scenario", "get_scenario", "oracle"]
