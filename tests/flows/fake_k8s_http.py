"""The HTTP side of the fake Kubernetes API (:mod:`tests.flows.fake_k8s_api`): the verbs a
client sends (POST, PATCH, PUT, DELETE, GET: get, list, watch, a pod's log) turned into calls on
the :class:`~tests.flows.fake_k8s_api.FakeKubernetes` that serves them, and label/field
selectors."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from tests.flows.fake_k8s_errors import ApiError, json_patch, merge_patch, not_found
from tests.flows.rbac import Attributes, request_attributes

if TYPE_CHECKING:
    from tests.flows.fake_k8s_api import FakeKubernetes


def handler_class(fake: FakeKubernetes) -> type[BaseHTTPRequestHandler]:
    """The request handler class of the server ``fake`` answers for."""
    return type("Handler", (FakeApiHandler,), {"fake": fake})


class FakeApiHandler(BaseHTTPRequestHandler):
    """One request to the fake API server: :attr:`fake` (set by :func:`handler_class`) holds
    the objects, authorizes, decodes and stores."""

    fake: FakeKubernetes

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # plumbing ------------------------------------------------------------

    def _serve(self, verb_handler: Callable[[Attributes, dict[str, list[str]]], None]) -> None:
        with self.fake.lock:
            self.fake.requests.append((self.command, urlparse(self.path).path))
        attributes = request_attributes(self.command, self.path)
        try:
            if attributes is None:
                raise ApiError(404, "NotFound", f"the server could not find {self.path}")
            self.fake.authorize(attributes)
            verb_handler(attributes, parse_qs(urlparse(self.path).query))
        except ApiError as error:
            self._send(error.code, error.status)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _send(self, code: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for warning in self.warnings:
            self.send_header("Warning", f"299 - {json.dumps(warning)}")
        self.end_headers()
        self.wfile.write(data)

    warnings: Sequence[str] = ()  # the Warning headers of the answer

    @staticmethod
    def _validation(query: dict[str, list[str]]) -> str:
        """``fieldValidation``: Strict, Warn (the server's default) or Ignore."""
        return query.get("fieldValidation", ["Warn"])[0]

    # verbs ---------------------------------------------------------------

    def do_POST(self) -> None:
        def create(attributes: Attributes, query: dict[str, list[str]]) -> None:
            stored, self.warnings = self.fake.create(
                attributes, self._body(), self._validation(query)
            )
            self._send(201, stored)

        self._serve(create)

    def do_PATCH(self) -> None:
        def patch(attributes: Attributes, query: dict[str, list[str]]) -> None:
            content_type = (self.headers.get("Content-Type") or "").split(";")[0]
            body = self._body()
            custom = attributes.group not in ("", "batch", "apps")
            if content_type == "application/strategic-merge-patch+json" and custom:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media "
                    "types include: application/json-patch+json, "
                    "application/merge-patch+json, application/apply-patch+yaml",
                )
            if content_type == "application/json-patch+json":

                def new_of(current: dict[str, Any]) -> dict[str, Any]:
                    return json_patch(current, body)
            else:
                strategic = content_type == "application/strategic-merge-patch+json"

                def new_of(current: dict[str, Any]) -> dict[str, Any]:
                    return merge_patch(current, body, strategic)

            changed, self.warnings = self.fake.change(attributes, new_of, self._validation(query))
            self._send(200, changed)

        self._serve(patch)

    def do_PUT(self) -> None:
        def update(attributes: Attributes, query: dict[str, list[str]]) -> None:
            body = self._body()
            changed, self.warnings = self.fake.change(
                attributes, lambda _: body, self._validation(query)
            )
            self._send(200, changed)

        self._serve(update)

    def do_DELETE(self) -> None:
        def delete(attributes: Attributes, query: dict[str, list[str]]) -> None:
            options = self._body() if self.headers.get("Content-Length") else {}
            propagation = query.get("propagationPolicy", [None])[0]
            propagation = propagation or (options or {}).get("propagationPolicy")
            if attributes.verb == "deletecollection":
                with self.fake.lock:
                    names = [
                        key[2]
                        for key, obj in self.fake.objects.items()
                        if key[:2] == (attributes.resource, attributes.namespace)
                        and matches(obj, query)
                    ]
                    for name in names:
                        self.fake.remove(
                            attributes.resource, attributes.namespace, name, propagation
                        )
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                return
            with self.fake.lock:
                obj = self.fake.remove(
                    attributes.resource, attributes.namespace, attributes.name, propagation
                )
                payload = copy.deepcopy(obj)
            if obj is None:
                raise not_found(attributes)
            if attributes.resource == "jobs" and propagation is None:
                self.warnings = [
                    "child pods are preserved by default when jobs are deleted; set "
                    "propagationPolicy=Background to remove them or set "
                    "propagationPolicy=Orphan to suppress this warning"
                ]
            self._send(200, payload)

        self._serve(delete)

    def do_GET(self) -> None:
        def read(attributes: Attributes, query: dict[str, list[str]]) -> None:
            if attributes.subresource == "log":
                follow = query.get("follow", ["false"])[0] == "true"
                self._log(attributes, follow)
            elif attributes.verb == "get":
                obj = self.fake.get(attributes.resource, attributes.namespace, attributes.name)
                if obj is None:
                    raise not_found(attributes)
                self._send(200, obj)
            elif attributes.verb == "watch":
                self._watch(attributes, query)
            else:
                self._list(attributes, query)

        self._serve(read)

    # reads ---------------------------------------------------------------

    def _list(self, attributes: Attributes, query: dict[str, list[str]]) -> None:
        with self.fake.lock:
            items = [
                obj
                for (k, ns, _), obj in self.fake.objects.items()
                if k == attributes.resource and ns == attributes.namespace and matches(obj, query)
            ]
            payload = json.dumps(
                {
                    "kind": "List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.fake.version)},
                    "items": items,
                }
            ).encode()
        self._send(200, payload)

    def _stream_start(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Connection", "close")
        self.end_headers()

    def _watch(self, attributes: Attributes, query: dict[str, list[str]]) -> None:
        resource, namespace = attributes.resource, attributes.namespace
        timeout = float(query.get("timeoutSeconds", ["5"])[0])
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        deadline = time.monotonic() + timeout
        self._stream_start("application/json")

        def selected(kind: str, obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return (kind, meta.get("namespace")) == (resource, namespace) and matches(obj, query)

        with self.fake.lock:
            current = [(k[0], obj) for k, obj in self.fake.objects.items() if selected(k[0], obj)]
            if since:  # a resumed watch: what existed then is known
                known = {obj["metadata"]["name"] for _, obj in current}
                known |= {
                    obj["metadata"]["name"]
                    for version, kind, obj in self.fake.tombstones
                    if version > since and selected(kind, obj)
                }
                cursor = floor = since
            else:  # a fresh watch starts with every object, as ADDED
                known, cursor, floor = set(), 0, self.fake.version
            while True:
                events: list[tuple[int, str, dict[str, Any]]] = []
                for (kind, _, name), obj in self.fake.objects.items():
                    version = int(obj["metadata"]["resourceVersion"])
                    if version > cursor and selected(kind, obj):
                        events.append((version, "MODIFIED" if name in known else "ADDED", obj))
                        known.add(name)
                for version, kind, obj in self.fake.tombstones:
                    name = obj["metadata"]["name"]
                    fresh = version > max(cursor, floor)
                    if fresh and name in known and selected(kind, obj):
                        events.append((version, "DELETED", obj))
                        known.discard(name)
                cursor = self.fake.version
                for _, event, obj in sorted(events, key=lambda item: item[0]):
                    self._event(event, obj)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self.fake.lock.wait(remaining)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self.wfile.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        self.wfile.flush()

    def _log(self, attributes: Attributes, follow: bool) -> None:
        namespace, pod = attributes.namespace, attributes.name
        with self.fake.lock:
            if (namespace, pod) not in self.fake.logs:
                raise ApiError(404, "NotFound", f'pods "{pod}" not found')
            if not follow:
                text = "".join(line + "\n" for line in self.fake.logs[(namespace, pod)])
                self._send(200, text.encode(), "text/plain")
                return
        self._stream_start("text/plain")
        sent = 0
        with self.fake.lock:
            while True:
                lines = self.fake.logs.get((namespace, pod), [])
                for line in lines[sent:]:
                    self.wfile.write(line.encode() + b"\n")
                self.wfile.flush()
                sent = len(lines)
                pod_obj = self.fake.objects.get(("pods", namespace, pod))
                if pod_obj is None or pod_obj["status"]["phase"] in ("Succeeded", "Failed"):
                    return
                self.fake.lock.wait(1.0)


def matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    """labelSelector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``) and the metadata.name /
    metadata.namespace fieldSelector."""
    labels = obj["metadata"].get("labels") or {}
    for selector in query.get("labelSelector", []):
        for requirement in filter(None, selector.split(",")):
            if "!=" in requirement:
                key, value = requirement.split("!=", 1)
                if labels.get(key) == value:
                    return False
            elif "=" in requirement:
                key, value = requirement.split("=", 1)
                if labels.get(key) != value.lstrip("="):
                    return False
            elif requirement.startswith("!"):
                if requirement[1:] in labels:
                    return False
            elif requirement not in labels:
                return False
    for selector in query.get("fieldSelector", []):
        for requirement in filter(None, selector.split(",")):
            key, _, value = requirement.partition("=")
            field = key.removeprefix("metadata.")
            if field in ("name", "namespace") and obj["metadata"].get(field) != value.lstrip("="):
                return False
    return True
