"""`python -m infrarsi_services.proposer` (also `infrarsi serve proposer`)."""

from infrarsi.runtime.service import main

from .service import ProposerService

main(ProposerService)
