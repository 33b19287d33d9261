"""A study: what the user allows (the contract), what the search sees of it, and where it stands.

- ``contract``: the study contract (models, knobs, checks against the repository, the patch library, loading).
- ``scaffold``: a contract draft from the command a user already runs.
- ``inputs``: the workload's inputs outside git, locked at ``init``.
- ``userfiles``: reading the files a user hands the CLI.
- ``space``: the contract as the modeling package sees it (search space, baseline, priors, capacity).
- ``shape``: the workload's shape for the structural memory model.
- ``model``: the study's trial outcomes as observations, its ``Searcher`` and the modeler's fold.
- ``ledger``: each trial's ``TrialFinished`` paired with its ``TrialMeasured``.
- ``lifecycle``: studies as things a user manages (stage, trials, best verified speed-up, cost).
"""
