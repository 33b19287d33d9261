"""`python -m infrarsi_services.verifier` (also `infrarsi serve verifier`)."""

from infrarsi.runtime.service import main

from .service import VerifierService

main(VerifierService)
