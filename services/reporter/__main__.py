from infrarsi.service import main
from infrarsi_services.reporter.service import ReporterService

if __name__ == "__main__":
    main(ReporterService)
