# One image for the six InfraRSI services (docker-compose.yml runs `infrarsi serve <name>` in each).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# git: the launcher materialises trials as git worktrees and applies patches with `git apply`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/*

# torch first, from the CPU wheel index: the default index resolves torch to the CUDA build (several GB).
# Same pin as pyproject.toml. For GPU trials use a CUDA base image and the matching index instead.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /app
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
COPY workloads ./workloads
RUN pip install -e .

RUN useradd --create-home --uid 10001 infrarsi \
 && mkdir -p /var/lib/infrarsi \
 && chown infrarsi /var/lib/infrarsi
USER infrarsi

CMD ["infrarsi", "--help"]
