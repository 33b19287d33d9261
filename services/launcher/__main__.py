from infrarsi.runtime.service import main

from .service import LauncherService

if __name__ == "__main__":
    main(LauncherService)
