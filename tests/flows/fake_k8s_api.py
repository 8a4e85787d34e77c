"""A tiny Kubernetes API server for launcher tests: just the endpoints the launcher calls.

It is a threaded :mod:`http.server` that keeps objects in memory and plays a scripted scenario
when a ``Job`` or ``RayJob`` is created: it makes the run's pods (with the labels of their pod
templates), moves them through their phases, writes their logs and updates the job's status.

Endpoints: create/get/list/delete ``batch/v1`` jobs and ``ray.io/v1`` rayjobs; create/patch/
delete configmaps; list pods by ``labelSelector``; pod logs (``follow=true`` streams until the
pod ends); ``?watch=true`` on the job and rayjob lists, answered with newline-delimited JSON
events (ADDED, MODIFIED, DELETED) until ``timeoutSeconds``.

Scenarios: ``success``, ``oom`` (a container OOMKilled), ``unschedulable`` (PodScheduled=False),
``imagepull`` (ImagePullBackOff), ``config_error`` (the stage exits 2), ``hang`` (runs until
deleted: for cancellation), ``api_error`` (creating a job answers 503).

Example::

    with FakeKubernetes("success") as fake:
        launcher = KubernetesLauncher(settings, api_client=fake.api_client())
        launcher.run("eval", None, [], {})
        fake.requests  # [("POST", "/apis/batch/v1/namespaces/llmrl/jobs"), ...]
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

SCENARIOS = (
    "success",
    "oom",
    "unschedulable",
    "imagepull",
    "config_error",
    "hang",
    "api_error",
)

Key = tuple[str, str, str]  # (kind, namespace, name)


class FakeKubernetes:
    """The fake API server; ``host`` is its URL. Use it as a context manager.

    ``summary`` is the JSON object the driver prints last (``prepare`` prints ``summary_path``);
    ``step_s`` is the pause between the scenario's steps.
    """

    def __init__(
        self,
        scenario: str = "success",
        *,
        summary: dict[str, Any] | None = None,
        summary_path: str = "/shared/runs/pipeline/data/arithmetic-0123456789abcdef",
        step_s: float = 0.1,
    ) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
        self.scenario = scenario
        self.summary = summary or {"step": 2, "final_checkpoint": "/shared/ckpt/model"}
        self.summary_path = summary_path
        self.step_s = step_s
        self.objects: dict[Key, dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        self._version = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubernetes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.objects.clear()
            self.lock.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` pointed at this server."""
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.host))

    # -- what the tests look at

    def deletes(self) -> list[str]:
        """Paths of the DELETE requests received."""
        return [path for method, path in self.requests if method == "DELETE"]

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [obj for (kind, _, _), obj in self.objects.items() if kind == "pods"]

    # -- state changes (callers hold the lock)

    def _bump(self, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self.lock.notify_all()

    def _store(self, kind: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        metadata.setdefault("namespace", namespace)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = datetime.now(timezone.utc).isoformat()
        self.objects[(kind, namespace, metadata["name"])] = body
        self._bump(body)
        return body

    def _delete(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.pop((kind, namespace, name), None)
        if obj is None:
            return None
        if kind in ("jobs", "rayjobs"):  # garbage collection: its pods and owned configmaps
            uid = obj["metadata"]["uid"]
            for key, other in list(self.objects.items()):
                labels = other["metadata"].get("labels") or {}
                owners = other["metadata"].get("ownerReferences") or []
                if (labels.get("llmrl.io/run") == name and key[0] == "pods") or any(
                    owner.get("uid") == uid for owner in owners
                ):
                    self.objects.pop(key)
        self._bump(obj)
        return obj

    # -- the scenario

    def _start_scenario(self, kind: str, obj: dict[str, Any]) -> None:
        thread = threading.Thread(target=self._play, args=(kind, obj), daemon=True)
        thread.start()

    def _play(self, kind: str, obj: dict[str, Any]) -> None:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        with self.lock:
            pods = self._make_pods(kind, obj)
            driver = pods[-1]
        for step in self._steps(kind, obj, driver, pods):
            time.sleep(self.step_s)
            with self.lock:
                if (kind, namespace, name) not in self.objects:
                    return  # deleted: the scenario ends
                step()

    def _make_pods(self, kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The run's pods, Pending; the driver (job pod or RayJob submitter) is the last one."""
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        spec = obj["spec"]
        templates: list[tuple[str, dict[str, Any]]] = []
        if kind == "jobs":
            templates.append(("job", spec["template"]))
        else:
            cluster = spec["rayClusterSpec"]
            templates.append(("head", cluster["headGroupSpec"]["template"]))
            for group in cluster.get("workerGroupSpecs") or []:
                for index in range(group.get("replicas", 1)):
                    templates.append((f"{group['groupName']}-{index}", group["template"]))
            templates.append(("submitter", spec["submitterPodTemplate"]))
        pods = []
        for suffix, template in templates:
            pod_name = f"{name}-{suffix}"
            containers = [c["name"] for c in template["spec"]["containers"]]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                },
                "spec": template["spec"],
                "status": {"phase": "Pending", "conditions": []},
                "_containers": containers,
            }
            pods.append(self._store("pods", namespace, pod))
            self.logs[(namespace, pod_name)] = []
        return pods

    def _steps(
        self, kind: str, obj: dict[str, Any], driver: dict[str, Any], pods: list[dict[str, Any]]
    ) -> list[Callable[[], None]]:
        namespace = obj["metadata"]["namespace"]
        stage = obj["metadata"]["labels"].get("llmrl.io/stage", "eval")
        log = self.logs[(namespace, driver["metadata"]["name"])]
        config = [f"stage: {stage}", "seed: 0", "progress: false"]
        last = self.summary_path if stage == "prepare" else json.dumps(self.summary)
        trailer = ["------", "Job 'raysubmit_1' succeeded", "------"] if kind == "rayjobs" else []
        scenario = self.scenario

        def running() -> None:
            for pod in pods:
                _set_running(pod)
                self._bump(pod)
            if kind == "rayjobs":
                obj["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}
                self._bump(obj)
            log.extend(config)
            self.lock.notify_all()

        def finish_success() -> None:
            log.extend(["INFO llmrl: step 1", "INFO llmrl: step 2", last, *trailer])
            _set_terminated(driver, 0, "Completed")
            self._bump(driver)
            _set_success(kind, obj)
            self._bump(obj)

        def finish_config_error() -> None:
            log.append(
                f"llmrl {stage}: error: --set max_new_tokens=0: max_new_tokens: "
                "Input should be greater than or equal to 1"
            )
            if kind == "jobs":
                _set_terminated(driver, 2, "Error")
            else:
                _set_terminated(driver, 1, "Error")
            self._bump(driver)
            _set_failure(kind, obj, "Job entrypoint command failed with exit code 2")
            self._bump(obj)

        def oom() -> None:
            victim = driver if kind == "jobs" else pods[1 if len(pods) > 2 else 0]
            _set_terminated(victim, 137, "OOMKilled")
            if kind == "rayjobs":  # a Ray worker restarts: the OOM is its last state
                status = victim["status"]["containerStatuses"][0]
                status["lastState"] = status.pop("state")
                status["state"] = {"running": {}}
                status["restartCount"] = 1
                victim["status"]["phase"] = "Running"
            self._bump(victim)
            if kind == "jobs":
                _set_failure(kind, obj, "Job has reached the specified backoff limit")
                self._bump(obj)

        def unschedulable() -> None:
            for pod in pods:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ]
                self._bump(pod)

        def image_pull() -> None:
            for pod in pods:
                pod["status"]["containerStatuses"] = [
                    {
                        "name": name,
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "llmrl:missing"',
                            }
                        },
                    }
                    for name in pod["_containers"]
                ]
                self._bump(pod)

        def progress() -> None:
            log.append("INFO llmrl: still training")
            self.lock.notify_all()

        return {
            "success": [running, finish_success],
            "config_error": [running, finish_config_error],
            "oom": [running, oom],
            "unschedulable": [unschedulable],
            "imagepull": [image_pull],
            "hang": [running, *[progress] * 10_000],
            "api_error": [],
        }[scenario]


def _set_running(pod: dict[str, Any]) -> None:
    pod["status"]["phase"] = "Running"
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    pod["status"]["containerStatuses"] = [
        {"name": name, "ready": True, "restartCount": 0, "state": {"running": {}}}
        for name in pod["_containers"]
    ]


def _set_terminated(pod: dict[str, Any], code: int, reason: str) -> None:
    pod["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    pod["status"]["containerStatuses"] = [
        {
            "name": name,
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason}},
        }
        for name in pod["_containers"]
    ]


def _set_success(kind: str, obj: dict[str, Any]) -> None:
    if kind == "jobs":
        obj["status"] = {
            "succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True"}],
        }
    else:
        obj["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}


def _set_failure(kind: str, obj: dict[str, Any], message: str) -> None:
    if kind == "jobs":
        obj["status"] = {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                }
            ],
        }
    else:
        obj["status"] = {
            "jobDeploymentStatus": "Complete",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": message,
        }


# ------------------------------------------------------------------------ HTTP


def _handler_class(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        # routing -------------------------------------------------------------

        def _route(self) -> tuple[str, str, str | None, str | None, dict[str, list[str]]]:
            """(kind, namespace, name, subresource, query) of the request path."""
            url = urlparse(self.path)
            parts = [p for p in url.path.split("/") if p]
            query = parse_qs(url.query)
            # /api/v1/namespaces/NS/KIND[/NAME[/SUB]]
            # /apis/GROUP/VERSION/namespaces/NS/KIND[/NAME]
            index = parts.index("namespaces")
            namespace, kind = parts[index + 1], parts[index + 2]
            name = parts[index + 3] if len(parts) > index + 3 else None
            sub = parts[index + 4] if len(parts) > index + 4 else None
            return kind, namespace, name, sub, query

        def _record(self) -> None:
            with fake.lock:
                fake.requests.append((self.command, urlparse(self.path).path))

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "message": message,
                    "code": code,
                },
            )

        # verbs ---------------------------------------------------------------

        def do_POST(self) -> None:
            self._record()
            kind, namespace, _, _, _ = self._route()
            body = self._body()
            if kind in ("jobs", "rayjobs") and fake.scenario == "api_error":
                self._status(503, "ServiceUnavailable", "etcdserver: request timed out")
                return
            with fake.lock:
                if (kind, namespace, body["metadata"]["name"]) in fake.objects:
                    self._status(409, "AlreadyExists", "already exists")
                    return
                stored = fake._store(kind, namespace, body)
                fake.created.append(json.loads(json.dumps(stored)))
                payload = json.dumps(stored).encode()
            if kind in ("jobs", "rayjobs"):
                fake._start_scenario(kind, stored)
            self._send(201, payload)

        def do_PATCH(self) -> None:
            self._record()
            kind, namespace, name, _, _ = self._route()
            patch = self._body()
            with fake.lock:
                obj = fake.objects.get((kind, namespace, name or ""))
                if obj is None:
                    self._status(404, "NotFound", f"{kind} {name} not found")
                    return
                obj["metadata"].update(patch.get("metadata") or {})
                fake._bump(obj)
                payload = json.dumps(obj).encode()
            self._send(200, payload)

        def do_DELETE(self) -> None:
            self._record()
            kind, namespace, name, _, _ = self._route()
            with fake.lock:
                obj = fake._delete(kind, namespace, name or "")
            if obj is None:
                self._status(404, "NotFound", f"{kind} {name} not found")
            else:
                self._send(200, {"kind": "Status", "status": "Success"})

        def do_GET(self) -> None:
            self._record()
            kind, namespace, name, sub, query = self._route()
            if sub == "log":
                self._log(namespace, name or "", query.get("follow", ["false"])[0] == "true")
            elif name:
                with fake.lock:
                    obj = fake.objects.get((kind, namespace, name))
                    payload = json.dumps(obj).encode() if obj else None
                if payload is None:
                    self._status(404, "NotFound", f"{kind} {name} not found")
                else:
                    self._send(200, payload)
            elif query.get("watch", ["false"])[0] == "true":
                self._watch(kind, namespace, query)
            else:
                self._list(kind, namespace, query)

        def _list(self, kind: str, namespace: str, query: dict[str, list[str]]) -> None:
            with fake.lock:
                items = [
                    obj
                    for (k, ns, _), obj in fake.objects.items()
                    if k == kind and ns == namespace and _matches(obj, query)
                ]
                payload = json.dumps(
                    {
                        "kind": "List",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(fake._version)},
                        "items": items,
                    }
                ).encode()
            self._send(200, payload)

        def _stream_start(self, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Connection", "close")
            self.end_headers()

        def _watch(self, kind: str, namespace: str, query: dict[str, list[str]]) -> None:
            name = query.get("fieldSelector", ["metadata.name="])[0].split("=", 1)[1]
            timeout = float(query.get("timeoutSeconds", ["5"])[0])
            sent = int(query.get("resourceVersion", ["0"])[0] or 0)
            deadline = time.monotonic() + timeout
            self._stream_start("application/json")
            with fake.lock:
                while True:
                    obj = fake.objects.get((kind, namespace, name))
                    if obj is None and sent:
                        self._event("DELETED", {"metadata": {"name": name}})
                        return
                    if obj is not None and int(obj["metadata"]["resourceVersion"]) > sent:
                        self._event("ADDED" if not sent else "MODIFIED", obj)
                        sent = int(obj["metadata"]["resourceVersion"])
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return
                    fake.lock.wait(remaining)

        def _event(self, kind: str, obj: dict[str, Any]) -> None:
            self.wfile.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            self.wfile.flush()

        def _log(self, namespace: str, pod: str, follow: bool) -> None:
            with fake.lock:
                if (namespace, pod) not in fake.logs:
                    self._status(404, "NotFound", f"pod {pod} not found")
                    return
                if not follow:
                    text = "".join(line + "\n" for line in fake.logs[(namespace, pod)])
                    self._send(200, text.encode(), "text/plain")
                    return
            self._stream_start("text/plain")
            sent = 0
            with fake.lock:
                while True:
                    lines = fake.logs.get((namespace, pod), [])
                    for line in lines[sent:]:
                        self.wfile.write(line.encode() + b"\n")
                    self.wfile.flush()
                    sent = len(lines)
                    pod_obj = fake.objects.get(("pods", namespace, pod))
                    if pod_obj is None or pod_obj["status"]["phase"] in ("Succeeded", "Failed"):
                        return
                    fake.lock.wait(1.0)

    return Handler


def _matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """Equality-based labelSelector and metadata.name fieldSelector."""
    labels = obj["metadata"].get("labels") or {}
    for selector in query.get("labelSelector", []):
        for requirement in selector.split(","):
            key, _, value = requirement.partition("=")
            if labels.get(key) != value:
                return False
    for selector in query.get("fieldSelector", []):
        key, _, value = selector.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value:
            return False
    return True
