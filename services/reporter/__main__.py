from infrarsi.runtime.service import main

from .service import ReporterService

if __name__ == "__main__":
    main(ReporterService)
