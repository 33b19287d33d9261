"""Judging trials and changes: statistics, the doctor, verification, and who may apply what.

- ``stats``: from a trial's step samples to a ``TrialMeasured`` and its invariant verdicts.
- ``doctor``: the baseline's noise floor, phase profile and statistical power.
- ``verification``: interleaved baseline/candidate plans, the paired bootstrap CI and the promotion decision.
- ``policy``: the apply policy (who must approve which kind of change, and when).
- ``approvals`` and ``signing``: signed approvals and the OpenSSH signatures under them.
- ``promotions``: promoted branches followed to the main line (merged, reverted, open).
"""
