"""One trial: its worktree, how knob values reach the job, and the processes that run it.

- ``workspace``: the workload's git repository (the golden baseline, per-trial worktrees, patches, branches).
- ``launch``: how a trial's knob values reach the job (launch file, flags, overrides, environment).
- ``sandbox``: the bubblewrap sandbox an untrusted job runs in.
- ``procs``: process trees (memory sampling, the emulated-capacity watchdog, killing, reaping).
- ``netns``: emulated hosts on one machine (network namespaces) for multi-node trials.
- ``slow``: the rule for stopping a search trial early as slow.
- ``joblog``: what a job's own printed output says (loss, steps) when it runs without a probe.
- ``checkpoints``: what verify asks a job to save or resume (jobs read it as ``infrarsi.probe.checkpointing``).
- ``fswatch``: waking when a directory's files change (inotify).
"""
