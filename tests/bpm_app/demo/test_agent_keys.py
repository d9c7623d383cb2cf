"""The demo's operator registers each participant and hands its agent only the participant's
own key: no agent holds the operator's key, even when the demo's own environment has it."""

from __future__ import annotations


from bpm_app.demo.federation import Federation
from spark_agents.hosts import Hosts
from tests.conftest import free_port


class _Operator:
    def __init__(self, registered: list[str]) -> None:
        self.registered = registered

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def add_participant(self, name: str, endpoint: str) -> dict:
        self.registered.append(name)
        return {"name": name, "api_key": f"key-of-{name}"}


def test_an_agent_gets_its_own_key_and_never_the_operator_s(tmp_path, monkeypatch):
    monkeypatch.setenv("BPM_ADMIN_KEY", "the-operator-key")
    fed = Federation(tmp_path, hosts=Hosts(tmp_path / "hosts", None, None))
    fed.hosts.add(Federation.REGISTRY)
    fed.host("a")
    registered: list[str] = []
    started: list[dict] = []
    monkeypatch.setattr(fed, "operator", lambda: _Operator(registered))
    monkeypatch.setattr(fed.hosts, "popen", lambda name, args, env, **kwargs: started.append(env))
    for _ in range(2):  # started, then restarted after a crash
        fed.start_agent("a", free_port("127.0.0.2"), {})
    assert registered == ["a"], "registered once, by the operator"
    assert [env.get("BPM_KEY") for env in started] == ["key-of-a", "key-of-a"]
    assert not [env for env in started if "BPM_ADMIN_KEY" in env]
