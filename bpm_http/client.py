"""A small synchronous client of the registry's JSON API, used by agents, the CLI and the demo."""

from __future__ import annotations

from typing import Any

import httpx


class RegistryError(Exception):
    """The registry refused a request; `status` is the HTTP status, `detail` its explanation."""

    def __init__(self, status: int, detail: Any, body: dict | None = None) -> None:
        self.status = status
        self.detail = detail
        self.body = body or {}
        super().__init__(f"{status}: {_text(detail, self.body)}")


def _text(detail: Any, body: dict) -> str:
    if isinstance(detail, str):
        return detail
    return body.get("message") or str(detail)


class RegistryClient:
    """Calls `/api/v1` with one key (operator or participant). Raises RegistryError on 4xx/5xx."""

    def __init__(self, base_url: str, key: str | None = None, *, timeout: float = 10.0, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.key = key
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, json: Any = None, params: dict | None = None) -> Any:
        params = {k: v for k, v in (params or {}).items() if v is not None}
        response = self._http.request(method, "/api/v1" + path, json=json, params=params)
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"detail": response.text}
            raise RegistryError(response.status_code, body.get("detail"), body)
        return response.json() if response.content else None

    def me(self) -> dict:
        """Who the key in use belongs to: `{"name", "role"}` (operator or participant)."""
        return self.request("GET", "/me")

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    # Participants
    def add_participant(self, name: str, endpoint: str) -> dict:
        return self.request("POST", "/participants", json={"name": name, "endpoint": endpoint})

    def participants(self) -> list[dict]:
        return self.request("GET", "/participants")

    def participant(self, name: str) -> dict:
        return self.request("GET", f"/participants/{name}")

    def heartbeat(self, name: str, report: dict) -> dict:
        return self.request("POST", f"/participants/{name}/heartbeat", json=report)

    def load_history(self, name: str) -> list[dict]:
        return self.request("GET", f"/participants/{name}/loads")

    # Contracts
    def propose(self, counterparty: str, price_min: float, price_max: float, min_duration_s: float, **extra: Any) -> dict:
        body = {"counterparty": counterparty, "price_min": price_min, "price_max": price_max, "min_duration_s": min_duration_s}
        body.update({k: v for k, v in extra.items() if v is not None})
        return self.request("POST", "/contracts", json=body)

    def counter(self, contract_id: int, price_min: float, price_max: float, min_duration_s: float) -> dict:
        body = {"price_min": price_min, "price_max": price_max, "min_duration_s": min_duration_s}
        return self.request("POST", f"/contracts/{contract_id}/counter", json=body)

    def contract_action(self, contract_id: int, action: str) -> dict:
        return self.request("POST", f"/contracts/{contract_id}/{action}")

    def contracts(self, participant: str | None = None, state: str | None = None) -> list[dict]:
        return self.request("GET", "/contracts", params={"participant": participant, "state": state})

    def contract(self, contract_id: int) -> dict:
        return self.request("GET", f"/contracts/{contract_id}")

    # Tasks
    def register_task(self, name: str, **fields: Any) -> dict:
        return self.request("POST", "/tasks", json={"name": name, **fields})

    def retire_task(self, task_id: int) -> dict:
        return self.request("POST", f"/tasks/{task_id}/retire")

    def view(self, name: str) -> dict:
        """What concerns participant `name` (its own key only): tasks, movements, replicas, failovers."""
        return self.request("GET", f"/participants/{name}/view")

    def tasks(self, host: str | None = None, origin: str | None = None, involving: str | None = None) -> list[dict]:
        return self.request("GET", "/tasks", params={"host": host, "origin": origin, "involving": involving})

    def rotate_key(self, name: str) -> dict:
        return self.request("POST", f"/participants/{name}/key")

    def revoke_key(self, name: str) -> dict:
        return self.request("DELETE", f"/participants/{name}/key")

    def register_certificate(self, name: str, pem: str) -> dict:
        return self.request("PUT", f"/participants/{name}/certificate", json={"certificate": pem})

    def use_key(self, key: str) -> None:
        """Act with `key` from now on (after a rotation)."""
        self.key = key
        self._http.headers["Authorization"] = f"Bearer {key}"

    # Call tokens between agents
    def call_token(self, task_id: int | None, purpose: str, audience: str, epoch: int | None) -> dict:
        return self.request("POST", "/tokens", json={"task_id": task_id, "purpose": purpose, "audience": audience, "epoch": epoch})

    def signing_keys(self) -> list[dict]:
        return self.request("GET", "/keys")

    def rotate_signing_key(self, revoke: bool = False) -> dict:
        return self.request("POST", "/keys/rotate", params={"revoke": "true"} if revoke else None)

    # Offers and movements
    def offer(self, contract_id: int, task_ids: list[int], price: float, *, caps: list[float] | None = None,
              loads: list[float] | None = None, ttl_s: float | None = None) -> dict:
        body: dict[str, Any] = {"contract_id": contract_id, "task_ids": task_ids, "price": price}
        if caps is not None:
            body["caps"] = caps
        if loads is not None:
            body["loads"] = loads
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return self.request("POST", "/offers", json=body)

    def offers(self, state: str | None = None) -> list[dict]:
        return self.request("GET", "/offers", params={"state": state})

    def get_offer(self, offer_id: int) -> dict:
        return self.request("GET", f"/offers/{offer_id}")

    def accept_offer(self, offer_id: int, task_ids: list[int] | None = None, price: float | None = None) -> dict:
        body = {k: v for k, v in {"task_ids": task_ids, "price": price}.items() if v is not None}
        return self.request("POST", f"/offers/{offer_id}/accept", json=body or None)

    def reject_offer(self, offer_id: int, reason: str | None = None) -> dict:
        return self.request("POST", f"/offers/{offer_id}/reject", json={"reason": reason} if reason else None)

    def withdraw_offer(self, offer_id: int) -> dict:
        return self.request("POST", f"/offers/{offer_id}/withdraw")

    def movements(self, participant: str | None = None, state: str | None = None) -> list[dict]:
        return self.request("GET", "/movements", params={"participant": participant, "state": state})

    def end_movement(self, movement_id: int) -> dict:
        return self.request("POST", f"/movements/{movement_id}/end")

    # Ledger and events
    def ledger(self, participant: str | None = None) -> dict:
        return self.request("GET", "/ledger", params={"participant": participant})

    def events(self, participant: str | None = None, after_id: int | None = None, kind: str | None = None, limit: int | None = None) -> list[dict]:
        return self.request("GET", "/events", params={"participant": participant, "after_id": after_id, "kind": kind, "limit": limit})

    def report_event(self, kind: str, message: str, subject: str | None = None, data: dict | None = None) -> dict:
        return self.request("POST", "/events", json={"kind": kind, "message": message, "subject": subject, "data": data or {}})

    # High availability
    def replicas(self, task_id: int | None = None, participant: str | None = None) -> list[dict]:
        return self.request("GET", "/replicas", params={"task_id": task_id, "participant": participant})

    def create_replica(self, task_id: int, participant: str, role: str | None = None, repair_of: int | None = None) -> dict:
        body = {k: v for k, v in {"participant": participant, "role": role, "repair_of": repair_of}.items() if v is not None}
        return self.request("POST", f"/tasks/{task_id}/replicas", json=body)

    def sync_replica(self, replica_id: int, epoch: int, position: int | None = None, bytes_copied: int | None = None) -> dict:
        body = {k: v for k, v in {"epoch": epoch, "position": position, "bytes_copied": bytes_copied}.items() if v is not None}
        return self.request("POST", f"/replicas/{replica_id}/sync", json=body)

    def drop_replica(self, replica_id: int) -> dict:
        return self.request("POST", f"/replicas/{replica_id}/drop")

    def failover(self, task_id: int, to: str, expected_epoch: int, reason: str | None = None) -> dict:
        body = {k: v for k, v in {"to": to, "expected_epoch": expected_epoch, "reason": reason}.items() if v is not None}
        return self.request("POST", f"/tasks/{task_id}/failover", json=body)

    def complete_failover(self, failover_id: int, recovery_s: float | None = None, details: dict | None = None) -> dict:
        body = {k: v for k, v in {"recovery_s": recovery_s, "details": details}.items() if v is not None}
        return self.request("POST", f"/failovers/{failover_id}/complete", json=body)

    def failovers(self, task_id: int | None = None) -> list[dict]:
        return self.request("GET", "/failovers", params={"task_id": task_id})
