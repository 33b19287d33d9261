"""The proposer's fold under ``StudyCancelled`` and ``StudyResumed`` (issue 36): nothing is proposed while a study is
cancelled; resume asks again for the verifications that had no verdict, and a replay of the same log decides
the same."""

from __future__ import annotations

from pathlib import Path

from infrarsi import events as ev
from infrarsi_services.proposer.logic import ProposerState, RunRequested
from test_proposer_logic import World, envelope, loader, of_type, run_events, study_created


class NoVerifier(World):
    """Runs the trials; nobody answers a verification (it is still running when the study is cancelled)."""

    def react(self, event: ev.Event) -> list[ev.Event]:
        return [] if isinstance(event.payload, ev.VerifyRequested) else super().react(event)


def test_a_cancelled_verification_is_asked_for_again_on_resume_and_replay_agrees(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=6)
    state = ProposerState(load_study=loader)
    log = run_events([state], NoVerifier(loader(created.payload)), [created, envelope(RunRequested(parallel=2))])
    [asked] = [e.payload for e in of_type(log, ev.VerifyRequested)]
    assert not of_type(log, ev.StudyFinished)

    cancel = envelope(ev.StudyCancelled(reason="budget", by="a@b"), source="cli.cancel")
    assert state.apply(cancel) == []
    assert state.apply(envelope(RunRequested(trials=6), source="cli.run")) == []  # a cancelled study waits
    resume = envelope(ev.StudyResumed(reason="go on"), source="cli.resume")
    [again] = state.apply(resume)
    assert isinstance(again.payload, ev.VerifyRequested)
    assert [c.key() for c in again.payload.candidates] == [c.key() for c in asked.candidates]
    assert again.payload.reason.startswith("resumed after a cancel: ")

    replayed = ProposerState(load_study=loader)
    for event in log:
        replayed.apply(event)
    replayed.apply(cancel)
    replayed.apply(envelope(RunRequested(trials=6), source="cli.run"))
    assert replayed.apply(resume) == [again]


def test_cancel_during_the_search_proposes_nothing_more_and_resume_fills_the_slots(tmp_path: Path) -> None:
    created = study_created(tmp_path, trials=6)
    state = ProposerState(load_study=loader)
    first = state.apply(created) + state.apply(envelope(RunRequested(parallel=2)))
    proposed = [e for e in first if isinstance(e.payload, ev.TrialProposed)]
    assert len(proposed) == 2
    assert state.apply(envelope(ev.StudyCancelled(reason="stop"), source="cli.cancel")) == []
    # the launcher ends both trials cancelled, as infrastructure failures: nothing is proposed in their place
    for p in proposed:
        done = envelope(ev.TrialFinished(status="cancelled", reason="study cancelled: stop", infrastructure=True,
                                         accelerator_s=3.0), trial_id=p.trial_id, source="launcher")
        assert state.apply(done) == []
    out = state.apply(envelope(ev.StudyResumed(), source="cli.resume"))
    reruns = [e.payload for e in out if isinstance(e.payload, ev.TrialProposed)]
    assert sorted(r.retry_of or "" for r in reruns) == sorted(p.trial_id or "" for p in proposed)
    assert [r.candidate_key for r in reruns] == [p.payload.candidate_key for p in proposed]
    study = state.studies[created.study_id]
    assert study.trials_used == 2 and study.ledger.accelerator_s == 6.0  # re-runs are outside the budget; cost kept
