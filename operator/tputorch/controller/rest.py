"""The REST transport the operator reads and writes the API through, without the typed clients
(their models, or their import, cost memory): one raw call (``raw_call``, which kube.py's writes
use too), JSON decoding that never fails for nesting, and ``RestSource``, the informers' lists
(paged) and watch streams (informer.py)."""

from __future__ import annotations

import json
import re
from typing import Callable, Iterator

from kubernetes.client.rest import ApiException


# Nesting the operator decodes. The API server admits 10,000 levels in a free-form field (runtimeEnv,
# engine.args); Python's decoder raises RecursionError near 1,000, which failed the whole list page
# or watch stream (every object of the kind stopped being reconciled). Deeper values are replaced by
# TOO_DEEP, which the spec parser refuses with the field named (api's nesting limit is far lower).
MAX_DECODE_DEPTH = 100
TOO_DEEP = f"<value nested deeper than {MAX_DECODE_DEPTH} levels: dropped by the operator>"
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def decode(text: str | bytes) -> object:
    """JSON from the API (a list page, a watch line): never fails for nesting. Objects within
    MAX_DECODE_DEPTH decode as they are, at json.loads' speed; a document deeper than Python's
    decoder goes has every subtree below MAX_DECODE_DEPTH replaced by TOO_DEEP."""
    try:
        return json.loads(text)
    except RecursionError:
        pass
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    kept, depth, start, cut_from = [], 0, 0, None
    for token in _TOKENS.finditer(text):
        ch = token.group()
        if ch in "[{":
            depth += 1
            if depth == MAX_DECODE_DEPTH + 1 and cut_from is None:
                cut_from = token.start()
        elif ch in "]}":
            depth -= 1
            if depth == MAX_DECODE_DEPTH and cut_from is not None:
                kept.append(text[start:cut_from])
                kept.append(json.dumps(TOO_DEEP))
                start, cut_from = token.end(), None
    kept.append(text[start:])
    return json.loads("".join(kept))


# Objects per page of a list, as client-go's informers page theirs: parsed whole, the lists of a
# restart over thousands of jobs were most of the operator's memory (bench/RESULTS.md, run 6).
LIST_PAGE = 500  # at most
# Pages are bounded in bytes too: the first asks for FIRST_PAGE objects, each next one for as many as
# would make PAGE_BYTES at the size the last page's objects had (100 labelled 1.4 MB pods in one
# page of 500 took a 512 Mi replica down).
FIRST_PAGE = 50
PAGE_BYTES = 8 * 1024 * 1024


def next_page_limit(limit: int, page_bytes: int) -> int:
    return max(1, min(LIST_PAGE, limit * PAGE_BYTES // max(page_bytes, 1)))
# The API server sends a bookmark about once a minute on a watch that asked for them: a watch
# silent for longer is taken as a half-open connection and resumed (from its resourceVersion).
WATCH_SILENCE = 150


def raw_call(api_client, method: str, path: str, timeout, query: list | None = None, body=None,
             content_type: str = "application/json"):
    """One API call without the typed clients (their models, or their import, cost memory): the
    raw answer (unread), or ApiException for any answer but 2xx. A body (a dict or list) is sent as
    json.dumps makes it: the client's own path first walks every value of it in Python
    (sanitize_for_serialization), which cost the operator more CPU per RayJob create than
    json.dumps itself (bench/RESULTS.md, issue 40)."""
    header_params = {"Accept": "application/json", **({"Content-Type": content_type} if body is not None else {})}
    method, url, headers, _body, _post = api_client.param_serialize(
        method, path, query_params=query, header_params=header_params, body=None,
        auth_settings=["BearerToken"])
    if body is None:
        resp = api_client.call_api(method, url, header_params=headers, body=None, _request_timeout=timeout)
    else:
        resp = api_client.rest_client.pool_manager.request(
            method, url, body=json.dumps(body, separators=(",", ":")).encode(), headers=headers,
            timeout=_timeout(timeout), preload_content=False)
    if not 200 <= resp.status <= 299:
        raise ApiException(status=resp.status, reason=resp.reason, body=resp.read().decode("utf-8", "replace"))
    return resp


def _timeout(timeout):
    """A request timeout as the client takes it (seconds, or (connect, read)) for urllib3."""
    import urllib3

    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout) if timeout else None


class RestSource:
    """A Source over raw GETs of the API (lists and watch streams parsed as JSON). Raw rather than
    the typed clients: pods would otherwise be deserialized into models only to be read as dicts."""

    def __init__(self, api_client, path: Callable[[str | None], str], label_selector: str | None,
                 field_selector: str | None = None) -> None:
        self.api, self.path, self.label_selector, self.field_selector = api_client, path, label_selector, field_selector

    def _get(self, scope, query: list, timeout: float):
        if self.label_selector:
            query = [*query, ("labelSelector", self.label_selector)]
        if self.field_selector:  # one object by name (Kueue's Workload CRD)
            query = [*query, ("fieldSelector", self.field_selector)]
        return raw_call(self.api, "GET", self.path(scope), timeout, query)

    def list(self, scope):
        """The list in pages of LIST_PAGE objects (one consistent snapshot: the first page's
        resourceVersion); items are parsed a page at a time as the caller consumes them, so a
        re-list of thousands never holds every full object at once."""
        raw = self._get(scope, [("limit", FIRST_PAGE)], 60).read()
        limit = next_page_limit(FIRST_PAGE, len(raw))
        first = decode(raw)
        del raw
        return {"items": self._pages(scope, first, limit), "metadata": first.get("metadata") or {}}

    def _pages(self, scope, page: dict, limit: int) -> Iterator[dict]:
        while True:
            token = (page.get("metadata") or {}).get("continue")
            items = page.get("items") or []
            del page
            items.reverse()
            while items:  # each item dropped once consumed: a page is held only while it is read
                yield items.pop()
            if not token:
                return
            raw = self._get(scope, [("limit", limit), ("continue", token)], 60).read()
            limit = next_page_limit(limit, len(raw))
            page = decode(raw)
            del raw

    def watch(self, scope, resource_version) -> Iterator[dict]:
        """The watch stream; it ends (as at the server's timeout) when nothing, not even a bookmark,
        came for WATCH_SILENCE: a half-open connection is noticed within that, not after 5.5 min."""
        from kubernetes.watch.watch import iter_resp_lines
        from urllib3.exceptions import ProtocolError, ReadTimeoutError

        query = [("watch", "true"), ("resourceVersion", resource_version), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", "300")]
        resp = self._get(scope, query, (10, WATCH_SILENCE))
        try:
            for line in iter_resp_lines(resp.response):
                if line:
                    yield decode(line)
        except (ReadTimeoutError, ProtocolError) as err:
            if not _silent(err):
                raise
        finally:
            resp.response.release_conn()


def _silent(err: Exception) -> bool:
    """A read that timed out (urllib3 may wrap it in a ProtocolError while reading a chunk)."""
    from urllib3.exceptions import ReadTimeoutError

    return isinstance(err, ReadTimeoutError) or "timed out" in str(err).lower()


def pods_path(scope):
    return "/api/v1/pods" if scope is None else f"/api/v1/namespaces/{scope}/pods"
