# Two images from one file: `registry` (the contract registry: the project without Spark,
# NATS, SciPy or matplotlib) and `agent` (a participant's agent and its replayer: Java 17
# for Spark, nats-server for the participant's broker, the `agent` extra).
#
# The base is pinned to a Python patch release on Debian 12 (bookworm), which packages
# openjdk-17-jre-headless and nats-server; the floating python:3.11-slim moves to newer
# Debian releases, which do not package Java 17.
FROM python:3.11.11-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
# Services run as an unprivileged user; /data (each participant's own volume) starts out as its own.
RUN useradd --uid 10001 --create-home bpm && mkdir -p /data && chown bpm:bpm /data
COPY pyproject.toml README.md ./
COPY bpm bpm
COPY bpm_app bpm_app
COPY bpm_http bpm_http
COPY api api
COPY spark_agents spark_agents
COPY migrations migrations
COPY examples examples

FROM base AS registry
RUN pip install --no-cache-dir .
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=2s --retries=30 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"]
CMD ["bpm", "registry", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS agent
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless nats-server procps \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir ".[agent]"
USER 10001:10001
