"""The modeler's state machine: trial facts in, ``ModelUpdated`` out. No I/O beyond loading a study's locked
contract files once (``load_study``, injectable).

``ModelerState.apply(event)`` returns the ``Emission`` s to publish, so ``services/modeler/service.py`` is a
``ReactiveService`` naming ``consumes`` and ``make_state`` (the base replays on start and publishes what
``apply`` returns, as for the proposer).

Priors: the built-in knowledge base and patch metadata, overridden by the experience bank's priors that
``init`` resolved and recorded in ``StudyCreated.bank`` (``StudySpace.with_bank``) — never read from the bank
stream, so a replay of the lifecycle stream alone gives the same models.

Per study it keeps a ``study.model.StudyModel`` (the same fold ``infrarsi model --replay`` runs): the
contract's ``StudySpace``, a ``TrialLedger`` (trial → candidate from ``TrialProposed``;
an outcome once a failed ``TrialFinished``, or an ok one and its ``TrialMeasured``, have arrived) and one
``Searcher`` whose time and censored memory models are refitted on every outcome — search, doctor and verify
trials alike (an OOM enters as ``peak > censored_peak_bytes``; crashes, timeouts and scope/patch failures
carry no time or memory information). Each outcome yields one ``ModelUpdated`` (key ``model:<n>``):

- ``time_effects`` / ``memory_effects``: for every knob setting other than the golden one (``name=value``) and
  every patch (``patch:<id>``), the log-ratio against the golden baseline when only that changes — prior
  (the knowledge base, patch metadata, or for memory the textbook formula) vs posterior, with stds from the
  Gaussian (time) and Laplace (memory) posteriors. ``source`` says where the prior came from;
- ``noise_std_log``, ``n_trials`` (outcomes in the models), ``n_oom``, ``fit_seconds`` (wall time of the
  refit and the effects — the one clock read; it is reported, never decided on);
- the best measured candidate by posterior mean and its predicted step, and diagnostics.

The proposer fits its own ``Searcher`` from the same events (see its docstring): one model code path, two
consumers. ``ModelUpdated`` is for humans (``infrarsi model``), the report and the bank.
"""

from __future__ import annotations

from dataclasses import dataclass

from infrarsi import events as ev
from infrarsi.modeling.search import Searcher
from infrarsi.runtime.service import Emission
from infrarsi.study.model import StudiesFold, StudyModel


@dataclass
class _Study:
    study_id: str
    model: StudyModel | None
    load_error: str | None


class ModelerState(StudiesFold[_Study]):
    """The modeler's read model and reactions, for every study on the bus."""

    def _new_study(self, study_id: str, created: ev.StudyCreated) -> _Study:
        space, error = self.load_space(created)
        model = StudyModel(space, study_id, config=self.config) if space is not None else None
        return _Study(study_id, model, error)

    def _apply_to(self, study: _Study, event: ev.Event) -> list[Emission]:
        if study.model is None:
            return []
        update = study.model.apply(event)
        if update is None:
            return []
        n = len(study.model.outcomes)
        return [Emission(update, study.study_id, event.trial_id, f"model:{n}")]

    # ------------------------------------------------------------------------------------------- queries

    def model(self, study_id: str) -> StudyModel | None:
        study = self.studies.get(study_id)
        return study.model if study is not None else None

    def searcher(self, study_id: str) -> Searcher | None:
        model = self.model(study_id)
        return model.searcher if model is not None else None

    def last_update(self, study_id: str) -> ev.ModelUpdated | None:
        model = self.model(study_id)
        return model.last if model is not None else None

    def status(self) -> dict[str, object]:
        studies: dict[str, object] = {}
        for sid, s in self.studies.items():
            m = s.model
            studies[sid] = {"outcomes": len(m.outcomes) if m else 0, "load_error": s.load_error,
                            "noise_std_log": m.last.noise_std_log if m and m.last else None}
        return {"studies": studies}
