"""Every ``INFRARSI_*`` environment variable, read and validated in one place.

Owns ``Settings``: what an InfraRSI process (the CLI, a service) takes from its environment, built once by
``cli.main`` / ``service.main`` with ``Settings.from_env()`` and passed down (library code takes the values it
needs as arguments and never reads the environment itself); and ``JobEnv``: what the launcher hands a training
job, which the probe and the simulator read inside the job. A bad value is a ``SettingsError`` naming the
variable, raised before the process does anything. Must not do anything but parse.

Process settings (``Settings``):

==============================  ================================  ==========================================
variable                        field                             meaning
==============================  ================================  ==========================================
``INFRARSI_NATS_URL``           ``nats_url``                      the bus, when ``--nats-url`` is not given
``INFRARSI_DATA_DIR``           ``data_dir``                      state directory (default ``.infrarsi``)
``INFRARSI_CLUSTER``            ``cluster``                       this cluster's id on events (default local)
``INFRARSI_REPLICAS``           ``replicas``                      stream replicas (1 embedded, 3 clustered)
``INFRARSI_LOG_LEVEL``          ``log_level``                     debug, info, warning or error
``INFRARSI_TRACE_FILE``         ``trace_file``                    write spans as JSON lines here
``INFRARSI_LAUNCHER_SLOTS``     ``launcher_slots``                trials the launcher runs at once
``INFRARSI_LAUNCHER_ACK_WAIT_S`` ``launcher_ack_wait_s``          the launcher consumer's ack wait (s)
``INFRARSI_PARENT_PID``         ``parent_pid``                    the stack whose death stops a service
``INFRARSI_ACK_JOURNAL``        ``ack_journal``                   a directory: log every JetStream ack there
``INFRARSI_SLURM_SACCT_COMPLETION`` ``slurm_sacct_completion``    Slurm: completion log (1) or accounting (0)
``INFRARSI_LLM_BASE_URL``       ``llm_base_url``                  the agent's endpoint (after the contract's)
``INFRARSI_LLM_MODEL``          ``llm_model``                     the agent's model (after the contract's)
``INFRARSI_LLM_API_KEY``        ``llm_api_key``                   the endpoint's key
``INFRARSI_LLM_API_KEY_FILE``   ``llm_api_key_file``              a file holding the key
==============================  ================================  ==========================================

A job's environment (``JobEnv``, set by the launcher, read by the probe and the simulator in the job):
``INFRARSI_STUDY``, ``INFRARSI_TRIAL``, ``INFRARSI_PROBE_DIR``, ``INFRARSI_NATS_URL``, ``INFRARSI_CLUSTER``,
``INFRARSI_TRACEPARENT``, ``INFRARSI_PEAK_FLOPS``, ``INFRARSI_RETRY_OF``, ``INFRARSI_DETERMINISTIC``, and the simulator's ``INFRARSI_SIM_SCENARIO``,
``INFRARSI_SIM_STEP_S`` and ``INFRARSI_SIM_SEED``; ``INFRARSI_LAUNCH_TAG`` marks a job's processes so the
launcher can find them (``infrarsi.trial.procs``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from infrarsi.errors import UserError

PREFIX = "INFRARSI_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class SettingsError(UserError):
    """An ``INFRARSI_*`` variable has a value the process cannot use."""


class _FromEnv(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The fields from ``INFRARSI_<FIELD>`` variables (unset or empty: the default)."""
        env = os.environ if environ is None else environ
        values = {name: env[var] for name in cls.model_fields if (var := env_var(name)) in env and env[var] != ""}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            var = env_var(str(first["loc"][0]))
            raise SettingsError(f"{var}={values.get(str(first['loc'][0]))!r}: {first['msg']}") from None


def env_var(field: str) -> str:
    """``launcher_slots`` → ``INFRARSI_LAUNCHER_SLOTS``."""
    return PREFIX + field.upper()


class Settings(_FromEnv):
    """What an InfraRSI process takes from its environment (the table in the module docstring)."""

    nats_url: str | None = None
    """The bus; ``--nats-url`` wins over it, a running ``infrarsi up`` under ``data_dir`` comes after it."""
    data_dir: Path = Path(".infrarsi")
    """Embedded server, logs, databases; ``--data-dir`` wins over it."""
    cluster: str = Field(default="local", pattern=r"^[A-Za-z0-9_-]+$")
    """This cluster's id on the events it publishes (a NATS subject token)."""
    replicas: int = Field(default=1, ge=1)
    """Replicas of the streams a process creates: 1 on the embedded server, 3 on a 3-node cluster."""
    log_level: str | None = None
    """Log level, any case: DEBUG, INFO, WARNING, ERROR (services default to info, the CLI to warning)."""
    trace_file: Path | None = None
    """Write every span as one JSON line here (when no OTLP endpoint is configured)."""
    launcher_slots: int = Field(default=1, ge=1)
    """Trials the launcher runs at once."""
    launcher_ack_wait_s: float = Field(default=30.0, gt=0)
    """How long the launcher's consumer waits for an ack before redelivering (its handlers heartbeat)."""
    parent_pid: int | None = Field(default=None, ge=1)
    """Set by a stack on the services it starts: the process whose death must stop them."""
    ack_journal: Path | None = None
    """A directory where the process appends every JetStream ack it receives (``infrarsi.bus.client.AckJournal``): fault
    benchmarks count them against what the streams hold afterwards (bench/chaos_cluster.py)."""
    slurm_sacct_completion: bool | None = None
    """The Slurm backend's job records: ``1`` reads the job-completion log (``sacct --completion``), ``0`` the
    accounting database; unset asks ``scontrol show config`` whether there is an accounting database."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve Prometheus metrics (``infrarsi.runtime.metrics``) on this port; ``infrarsi up`` gives its six services this
    port and the next five (proposer, launcher, telemetry, modeler, verifier, reporter); 0: each picks a free
    port (the scrape targets are written under ``<data_dir>/metrics/``). Unset: no metrics server."""
    metrics_addr: str = "127.0.0.1"
    """The address the metrics server binds (loopback unless told: the metrics name studies and trials)."""
    llm_base_url: str | None = None
    """The agent's OpenAI-compatible endpoint when the contract's ``agent.base_url`` is empty."""
    llm_model: str | None = None
    """The agent's model when the contract's ``agent.model`` is empty."""
    llm_api_key: str | None = Field(default=None, repr=False)
    """The endpoint's API key (never shown: not in ``repr``, redacted from recorded exchanges)."""
    llm_api_key_file: Path | None = None
    """A file whose first line is the API key, when ``agent.key_file`` is empty and no key is given."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str | None) -> str | None:
        if value is not None and value.upper() not in LOG_LEVELS:
            raise ValueError(f"unknown log level {value.upper()!r}; one of {', '.join(LOG_LEVELS)}")
        return value


LAUNCH_TAG_VAR = env_var("launch_tag")
"""``JobEnv.launch_tag``'s variable: ``<launcher state root>|<trial id>`` in every trial's environment, read from
other processes' environments (``infrarsi.trial.procs``) to find what a launcher started."""


class JobEnv(_FromEnv):
    """What the launcher hands a training job; read inside the job by the probe and the simulator."""

    study: str = "local"
    trial: str | None = None
    probe_dir: Path | None = None
    nats_url: str | None = None
    """Publish steps here (only together with ``trial``)."""
    cluster: str = "local"
    traceparent: str | None = None
    peak_flops: float | None = Field(default=None, gt=0)
    """Per-device FLOP/s, for MFU."""
    launch_tag: str | None = None
    retry_of: str | None = None
    """The trial this job runs again (``TrialProposed.retry_of``): the simulator replays that trial's draw."""
    deterministic: bool | None = None
    """Verify under ``invariants.parity: bitwise``: the probe turns torch's deterministic algorithms on when the
    job creates it (``Probe.from_env``), and reports at every step whether they stayed on."""
    checkpoint_dir: Path | None = None
    """Verify under ``verify.checkpoint_restart``: save a checkpoint here after ``checkpoint_step`` steps."""
    checkpoint_step: int | None = Field(default=None, ge=1)
    resume_from: Path | None = None
    """Resume from the checkpoint saved here (the next step is the one after the checkpoint's) instead of
    starting at step zero."""
    final_weights_dir: Path | None = None
    """Verify under ``verify.downstream``: save the final weights here for the downstream command."""
    sim_scenario: str | None = None
    sim_step_s: float | None = Field(default=None, ge=0)
    sim_seed: int | None = None

    def to_env(self) -> dict[str, str]:
        """The variables to put in the job's environment (unset fields are left out)."""
        return {env_var(name): str(value) for name, value in self.model_dump().items() if value is not None}
