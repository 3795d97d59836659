"""Informers: a local cache of one kind, kept current by list + watch, that tells handlers
which objects changed.

Shape (client-go's reflector + store, minus the parts we do not need):

- a daemon thread runs list, then watch from the list's resourceVersion, forever; when the
  server says the version is too old (410 ``Gone``, as HTTP status or as an ERROR event) it
  lists again; other failures back off (jittered, capped) and re-watch;
- the thread never touches the store: it posts each event to the event loop
  (``call_soon_threadsafe``), where the store is updated and the handler called, in order, so
  a handler always sees the store already containing what it was told about;
- every ``resync`` seconds the handler is called for every cached object, so a missed or
  mishandled event costs at most one resync period (level-triggered controllers rely on it).

Handlers get only the object (to compute a key); reconcilers re-read state from the store.

An informer may *transform* each object before it is stored (client-go's ``SetTransform``):
on the reflector thread, page by page, so only one page of whole objects is ever held
(``cdi.kube.informer_slim``: what the controller's and the webhook's caches keep).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from cdi.kube.client import JSON, Kube, Resource, object_key
from cdi.kube.errors import Gone, KubeError
from cdi.kube.informer_slim import SLIM_PAGE, Transform, keys_only

log = logging.getLogger(__name__)

Handler = Callable[[JSON], None]


class Informer:
    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        resync: float = 300.0,
        watch_timeout: int = 60,
        transform: Transform | None = None,
        page_size: int = 500,
    ) -> None:
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.resync = resync
        self.watch_timeout = watch_timeout
        self.transform = transform
        self.page_size = page_size
        self.store: dict[str, JSON] = {}
        self.handlers: list[Handler] = []
        self.relists = 0  # how many times a full list was needed (first one included)
        self._synced = asyncio.Event()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._resync_task: asyncio.Task[None] | None = None

    # -- reading ---------------------------------------------------------------------------
    def get(self, key: str) -> JSON | None:
        return self.store.get(key)

    def items(self) -> list[JSON]:
        return list(self.store.values())

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        name = f"informer-{self.resource.plural}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._resync_task = asyncio.create_task(self._resync_loop(), name=f"{name}-resync")

    def stop(self) -> None:
        self._stop.set()
        if self._resync_task is not None:
            self._resync_task.cancel()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.resync)
            for obj in list(self.store.values()):
                self._notify(obj)

    # -- the reflector thread --------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.5
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
                backoff = 0.5
            except Gone:
                log.info("%s: resourceVersion too old, listing again", self.resource.plural)
                rv = None
            except KubeError as exc:
                log.warning("%s: %s; retrying in %.1fs", self.resource.plural, exc, backoff)
                self._stop.wait(backoff * random.uniform(0.8, 1.2))
                backoff = min(backoff * 2, 30.0)
            except Exception:  # a bug must not kill the cache silently
                log.exception("%s: informer failed", self.resource.plural)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                rv = None

    def _list(self) -> str:
        items: list[JSON] = []
        cont: str | None = None
        rv = ""
        while True:
            page = self.kube.list(
                self.resource,
                self.namespace,
                label_selector=self.label_selector,
                limit=self.page_size,
                continue_=cont,
            )
            kind = self.resource.kind
            for obj in page.get("items") or []:
                obj.setdefault("kind", kind)
                obj.setdefault("apiVersion", self.resource.api_version)
                items.append(self._shape(obj))
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            cont = meta.get("continue")
            del page  # whole objects: gone before the next page is read
            if not cont:
                break
        self.relists += 1
        self._post(self._replace, items)
        return rv

    def _watch(self, rv: str) -> str:
        for kind, obj in self.kube.watch(
            self.resource,
            self.namespace,
            resource_version=rv,
            label_selector=self.label_selector,
            timeout_seconds=self.watch_timeout,
        ):
            if self._stop.is_set():
                break
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if kind == "BOOKMARK":
                continue
            self._post(self._apply, kind, self._shape(obj))
        return rv

    def _shape(self, obj: JSON) -> JSON:
        return obj if self.transform is None else self.transform(obj)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed while we were reading
            pass

    # -- on the event loop -----------------------------------------------------------------
    def _replace(self, items: list[JSON]) -> None:
        fresh = {object_key(o): o for o in items}
        gone = [o for k, o in self.store.items() if k not in fresh]
        self.store = fresh
        for obj in [*items, *gone]:
            self._notify(obj)
        self._synced.set()

    def _apply(self, kind: str, obj: JSON) -> None:
        key = object_key(obj)
        if kind == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = obj
        self._notify(obj)

    def _notify(self, obj: JSON) -> None:
        for handler in self.handlers:
            try:
                handler(obj)
            except Exception:
                log.exception("%s: handler failed", self.resource.plural)


async def wait_all_synced(informers: list[Informer]) -> None:
    """Until every informer has listed once (callers bound it with ``asyncio.timeout``)."""
    await asyncio.gather(*(i.wait_synced() for i in informers))


def keys_cache(kube: Kube, resource: Resource, *, resync: float = 300.0) -> Informer:
    """An informer that holds each object's identity only (``keys_only``), listed in small
    pages: for a cache asked only whether an object exists (the webhook's claims)."""
    return Informer(kube, resource, resync=resync, transform=keys_only, page_size=SLIM_PAGE)
