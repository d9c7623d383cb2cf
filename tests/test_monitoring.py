"""Prometheus and Grafana for the federation: deploy/prometheus.yml scrapes the registry and
every agent of docker-compose.yml, each agent labelled with its participant, and every
expression of docs/grafana-dashboard.json names only metrics the registry or an agent exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from spark_agents.settings import AgentSettings
from tests.spark_agents.test_agent_metrics import AGENT_METRICS
from tests.test_compose import agent_config

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "deploy/prometheus.yml"
DASHBOARD = "docs/grafana-dashboard.json"

# What PromQL reads before a parenthesis, and its other words: none is a metric.
FUNCTIONS = {"sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "clamp_min", "clamp_max"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
# The series of a family of each type, as Prometheus stores them.
SUFFIXES = {"gauge": ("",), "counter": ("",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}


def _yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _targets(config: dict) -> dict[str, dict[str, str]]:
    """Every static target of the scrape configuration: host:port -> its labels (its job's included)."""
    found: dict[str, dict[str, str]] = {}
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics", job
        assert job.get("scheme", "http") == ("https" if job["job_name"] == "agents" else "http"), "the agents serve HTTPS only"
        for group in job["static_configs"]:
            for target in group["targets"]:
                assert target not in found, f"{target} is scraped twice"
                found[target] = {"job": job["job_name"], **group.get("labels", {})}
    return found


def test_prometheus_scrapes_the_registry_and_every_agent_of_the_compose_file():
    services = _yaml("docker-compose.yml")["services"]
    agents = {name: AgentSettings.load(agent_config(s)) for name, s in services.items()
              if isinstance(s.get("command"), list) and s["command"][:3] == ["bpm", "agent", "run"]}
    assert set(agents) == set("abcd")
    targets = _targets(_yaml(CONFIG))
    registry = f"registry:{_option(services['registry']['command'], '--port')}"
    assert registry in targets and "participant" not in targets[registry], targets
    for name, settings in agents.items():
        target = f"{name}:{settings.port}"
        assert targets.get(target, {}).get("participant") == name, (target, targets)
        assert settings.name == name
    assert set(targets) == {registry} | {f"{name}:{s.port}" for name, s in agents.items()}


def test_the_prometheus_service_reads_the_configuration_and_shares_no_participant_s_volume():
    services = _yaml("docker-compose.yml")["services"]
    prometheus = services["prometheus"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"]), "a pinned version"
    assert prometheus["restart"] == "unless-stopped"
    assert f"./{CONFIG}:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert prometheus["ports"] == ["127.0.0.1:9090:9090"], "on loopback"
    own = {v.split(":")[0] for v in prometheus["volumes"] if not v.startswith((".", "/"))}
    others = {v.split(":")[0] for name, s in services.items() if name != "prometheus" for v in s.get("volumes") or []}
    assert not own & others, own & others


def _series(text: str) -> set[str]:
    """Every series name of the scraped families, whether they hold samples yet or not."""
    names = set()
    for family in text_string_to_metric_families(text):
        base = family.name + ("_total" if family.type == "counter" else "")
        names |= {base + suffix for suffix in SUFFIXES[family.type]}
    return names


def _registry_series(tmp_path) -> set[str]:
    from api.app import create_app
    from api.migrate import upgrade
    from api.settings import Settings

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(url)
    with TestClient(create_app(Settings(database_url=url), admin_key="op", migrate=False)) as http:
        http.get("/healthz")
        return _series(http.get("/metrics").text)


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression reads (strings, label matchers, ranges and groupings left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for word in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        if expr[word.end():].lstrip().startswith("("):
            assert word.group() in FUNCTIONS, f"{word.group()} in {expr}"
        elif word.group() not in KEYWORDS:
            names.add(word.group())
    return names


def test_the_dashboard_reads_only_metrics_that_exist(tmp_path):
    dashboard = json.loads((ROOT / DASHBOARD).read_text())
    exported = _registry_series(tmp_path) | {name + suffix for name, kind in AGENT_METRICS.items() for suffix in SUFFIXES[kind]}
    assert {"bpm_registry_offers", "bpm_registry_request_duration_seconds_bucket"} <= exported
    used = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names and names <= exported, (panel["title"], target["expr"], names - exported)
            used |= names
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert metric_names(variable["definition"].removeprefix("label_values(").split(",")[0]) <= exported
    # What the dashboard is for: load against threshold, batch durations, backlog, input
    # rows, the registry's offers and movements, its request latency.
    assert {"bpm_load", "bpm_threshold", "bpm_task_batch_duration_seconds_bucket", "bpm_task_backlog_messages", "bpm_task_input_rows_total",
            "bpm_registry_offers", "bpm_registry_movements", "bpm_registry_request_duration_seconds_bucket"} <= used
