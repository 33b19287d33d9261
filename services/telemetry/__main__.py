from infrarsi.runtime.service import main

from .service import TelemetryService

if __name__ == "__main__":
    main(TelemetryService)
