"""`python -m infrarsi_services.verifier` (also `infrarsi serve verifier`)."""

from infrarsi.service import main

from .service import VerifierService

main(VerifierService)
