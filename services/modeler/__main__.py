"""`python -m infrarsi_services.modeler` (also `infrarsi serve modeler`)."""

from infrarsi.runtime.service import main

from .service import ModelerService

main(ModelerService)
