# One image for every service of the federation (registry, agents, replayer).
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY bpm bpm
COPY bpm_app bpm_app
COPY bpm_http bpm_http
COPY api api
COPY spark_agents spark_agents
COPY migrations migrations
RUN pip install --no-cache-dir .
# Services run as an unprivileged user; /data (the shared volume) starts out as its own.
RUN useradd --uid 10001 --create-home bpm && mkdir -p /data && chown bpm:bpm /data
USER 10001:10001
