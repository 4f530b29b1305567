"""Peer-to-peer distribution of a workload's inputs between the nodes of its gang.

Vocabulary:
- *swarm*: the K distinct nodes of one attempt's gang materialising the same input. The
  input's blobs (artifacts.chunks `blob_sizes`: chunks of chunked files, contents of the
  others), in manifest order, are *striped*: blob i is *owned* by node i mod K.
- *peer server*: one per node of the swarm (in its first worker), serving blobs from the
  node's cache (runtime.cache) over HTTP: `GET /v1/blobs/<sha256>` with the header
  MAC_HEADER = HMAC-SHA256(key, "aicluster-peer:" + path).
- *grant*: what a peer server may serve (the blobs of the attempt's inputs) and its key,
  derived from the attempt's secret (the engine's per-attempt secret, runtime.launchers
  SECRET_ENV), which only the gang's workers are given.
- A pull runs two things at once: the *stripe* (the blobs this node owns, read from
  storage into its cache as blobs of their own, in the background) and the *assembly*
  (`BlobCache.materialise` with a fetch that takes a blob of the stripe from the cache
  once the stripe has it, and every other blob from its owner's peer server, which waits
  for it if its own stripe is still bringing it). Afterwards the stripe's chunks are
  served from the files holding them, and their own copies are dropped.

Invariants:
- A peer server reads nothing for a request whose MAC is missing or wrong (403); a digest
  outside its grant is 404. A MAC made with another attempt's key (another team's job)
  is refused even for a blob both nodes hold, so a grant never crosses teams.
- It serves only bytes of the cache (checked on their way in), never writes. For a blob
  its own node is still bringing in it waits at most `wait_s`, then 404.
- Every byte taken from a peer is hashed before it is handed to the cache (as
  artifacts.tree `Checked` bytes, which the cache writes without hashing them again).
  A peer's refusal, error, timeout, short body or wrong bytes makes that blob come from
  storage (a *fallback*, counted); a pull never fails because of a peer. A peer whose
  connection broke, or that refuses connections after it answered once (or for
  CONNECT_GRACE_S from the first try: it may not listen yet), is not asked again in
  that pull.
- Storage is read once per blob per swarm (by its owner), plus fallbacks and blobs over
  PEER_MAX bytes (these always come from storage: a peer's body is held in memory until
  it is checked).
- The stripe takes no lock an assembly holds (`BlobCache.ensure_apart`), and an
  assembly waits only for its own node's stripe and for peers' stripes, so pulls do not
  deadlock, even where two nodes share one cache folder (several Ray nodes on one
  machine); a wait for a peer is bounded by its server's wait and the client's timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import http.server
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from aicluster.artifacts.chunks import blob_sizes
from aicluster.artifacts.manifest import Manifest, is_digest
from aicluster.artifacts.tree import Checked
from aicluster.runtime.cache import PREFETCH, BlobCache, Fetch, Materialised, Progress

MAC_HEADER = "X-Aicluster-Peer-Mac"
PEER_MAX = 64 << 20  # larger blobs always come from storage
WAIT_S = 30.0  # how long a server waits for a blob its node is still fetching
TIMEOUT_S = 45.0  # a client's connect and read timeout (above the server's wait)
CONNECT_GRACE_S = 10.0  # how long a peer that never answered may refuse connections
_POLL_S = 0.05  # a waiting server looks at the cache this often (other processes fill it)


def peer_key(secret: str) -> bytes:
    """The attempt's key for peer requests (never the launch secret itself)."""
    return hmac.new(secret.encode(), b"aicluster-peers", hashlib.sha256).digest()


def request_mac(key: bytes, path: str) -> str:
    return hmac.new(key, b"aicluster-peer:" + path.encode(), hashlib.sha256).hexdigest()


def blob_mac(key: bytes, digest: str) -> str:
    return request_mac(key, f"/v1/blobs/{digest}")


@dataclass(frozen=True)
class SwarmPlan:
    """This node's place in the swarm: every node's peer server and its own index."""

    addrs: tuple[tuple[str, int], ...]
    node: int
    secret: str

    @classmethod
    def from_dict(cls, d: dict) -> SwarmPlan:
        addrs = tuple((str(h), int(p)) for h, p in d["addrs"])
        return cls(addrs, int(d["node"]), str(d["secret"]))

    def owner(self, index: int) -> int:
        return index % len(self.addrs)


@dataclass
class SwarmCounts:
    """What one pull read, and from where (bytes of blobs this node lacked)."""

    storage_bytes: int = 0
    peer_bytes: int = 0
    peer_blobs: int = 0
    fallbacks: int = 0  # blobs a peer did not deliver, read from storage instead
    refused: int = 0  # of those, refused by the peer (403: not this attempt's key)
    phases: dict = field(default_factory=dict)  # seconds: "stripe" (its last blob), "pull"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def line(self) -> str:
        mib = float(1 << 20)
        return (
            f"{self.peer_bytes / mib:.1f} MiB from peers, {self.storage_bytes / mib:.1f} MiB "
            f"from storage, {self.fallbacks} fallbacks"
        )


def blob_order(manifest: Manifest) -> dict[str, tuple[int, int]]:
    """digest -> (index, size) of every blob of the manifest, the same on every node."""
    return {d: (i, n) for i, (d, n) in enumerate(blob_sizes(manifest.files).items())}


# -- serving ----------------------------------------------------------------------------


class PeerServer:
    """Serves granted blobs of one node's cache to the swarm (see invariants)."""

    def __init__(
        self,
        cache: BlobCache,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        wait_s: float = WAIT_S,
    ):
        self.cache, self.key, self.wait_s = cache, peer_key(secret), wait_s
        self.granted: set[str] = set()
        self.pending: set[str] = set()  # this node's stripe, still being fetched
        self.cond = threading.Condition()
        self.served_bytes = self.refused = 0
        self.waiting = 0  # requests waiting for a pending blob right now
        self.httpd = http.server.ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.peer = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> PeerServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="peer-server", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
        self.httpd.server_close()
        with self.cond:
            self.pending.clear()
            self.cond.notify_all()

    def grant(self, digests: Iterable[str]) -> None:
        with self.cond:
            self.granted.update(digests)

    def expect(self, digests: Iterable[str]) -> None:
        """This node is bringing these blobs in: requests for them wait (bounded)."""
        with self.cond:
            self.pending.update(digests)

    def settle(self, digest: str) -> None:
        """This node is done with that blob (in the cache, or given up)."""
        with self.cond:
            self.pending.discard(digest)
            self.cond.notify_all()

    def find(self, digest: str) -> tuple[Path, int, int] | None:
        """Where the blob lies in the cache, waiting while it is still pending."""
        deadline = time.monotonic() + self.wait_s
        with self.cond:
            while True:
                where = self.cache.locate(digest)
                if where is not None or digest not in self.pending:
                    return where
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.waiting += 1
                try:
                    self.cond.wait(min(left, _POLL_S))
                finally:
                    self.waiting -= 1

    def _count(self, served: int = 0, refused: int = 0) -> None:
        with self.cond:
            self.served_bytes += served
            self.refused += refused


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 2 * TIMEOUT_S  # an idle kept-alive connection is closed after this

    def log_message(self, format, *args) -> None:
        pass

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        peer: PeerServer = self.server.peer  # type: ignore[attr-defined]
        given = self.headers.get(MAC_HEADER, "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, request_mac(peer.key, self.path).encode()):
            peer._count(refused=1)
            self._empty(403)
            return
        digest = self.path.removeprefix("/v1/blobs/")
        if not is_digest(digest) or digest not in peer.granted:
            self._empty(404)
            return
        where = peer.find(digest)
        if where is None:
            self._empty(404)
            return
        opened = _open_located(peer.cache, digest, where)
        if opened is None:
            self._empty(404)
            return
        f, offset, length = opened
        with f:
            self.send_response(200)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.flush()
            try:
                self.connection.sendfile(f, offset, length)
            except OSError:
                self.close_connection = True
                return
        peer._count(served=length)


def _open_located(cache: BlobCache, digest: str, where):
    """(open file, offset, length) of a located blob, looked up once more if it moved
    meanwhile (a chunk copy dropped, runtime.cache); None if it is gone."""
    for _ in range(2):
        if where is None:
            return None
        try:
            return open(where[0], "rb"), where[1], where[2]
        except OSError:
            where = cache.locate(digest)
    return None


# -- fetching ---------------------------------------------------------------------------


class PeerUnavailable(Exception):
    """A peer did not deliver a blob (the message says why); it comes from storage."""


class SwarmFetch:
    """The assembly's cache Fetch: a blob another node owns comes from its peer server,
    checked before it is handed on, else from storage (counted either way)."""

    def __init__(self, plan: SwarmPlan, order: dict, storage: Fetch, counts: SwarmCounts):
        self.plan, self.order, self.storage, self.counts = plan, order, storage, counts
        self.stripe: _Stripe | None = None  # this node's, coming in the background
        self.key = peer_key(plan.secret)
        self.dead: set[int] = set()  # not asked again in this pull
        self.reached: set[int] = set()  # answered at least once
        self._refused_since: dict[int, float] = {}
        self._local = threading.local()  # per thread: node -> kept-alive connection
        self._opened: list[http.client.HTTPConnection] = []

    def local_path(self, digest: str) -> str | None:
        """A blob of this node's stripe, once the stripe brought it (write_piece copies
        it in the kernel); None: fetch it."""
        if self.stripe is None:
            return None
        return self.stripe.wait(digest)

    def __call__(self, digest: str) -> Iterable[bytes]:
        index, size = self.order.get(digest, (None, 0))
        node = None if index is None else self.plan.owner(index)
        if node is None or node == self.plan.node or size > PEER_MAX or node in self.dead:
            if node is not None and node in self.dead and node != self.plan.node:
                self.counts.add(fallbacks=1)
            return self.from_storage(digest)
        try:
            body = self._get(node, digest, size)
        except PeerUnavailable as exc:
            self.counts.add(fallbacks=1, refused=int(str(exc) == "403"))
            return self.from_storage(digest)
        self.counts.add(peer_bytes=len(body), peer_blobs=1)
        return Checked(body, digest)

    def from_storage(self, digest: str) -> Iterator[bytes]:
        for chunk in self.storage(digest):
            self.counts.add(storage_bytes=len(chunk))
            yield chunk

    def _conn(self, node: int) -> http.client.HTTPConnection:
        conns = self._local.__dict__.setdefault("conns", {})
        if node not in conns:
            host, port = self.plan.addrs[node]
            conns[node] = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
            self._opened.append(conns[node])
        return conns[node]

    def _drop(self, node: int) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(node, None)
        if conn is not None:
            conn.close()

    def _request(self, node: int, path: str) -> http.client.HTTPResponse:
        """A response of `node` to `GET path` (its headers read). A peer that refuses
        connections before it ever answered may not listen yet: retried CONNECT_GRACE_S."""
        while True:
            conn = self._conn(node)
            try:
                conn.request("GET", path, headers={MAC_HEADER: request_mac(self.key, path)})
                resp = conn.getresponse()
            except ConnectionRefusedError:
                self._drop(node)
                first = self._refused_since.setdefault(node, time.monotonic())
                if node in self.reached or time.monotonic() - first > CONNECT_GRACE_S:
                    self.dead.add(node)
                    raise PeerUnavailable("connection refused") from None
                time.sleep(_POLL_S)  # back off, then ask again
                continue
            except (OSError, http.client.HTTPException) as exc:
                self._broken(node)
                raise PeerUnavailable(type(exc).__name__) from None
            self.reached.add(node)
            return resp

    def _broken(self, node: int) -> None:
        self._drop(node)
        self.dead.add(node)

    def _get(self, node: int, digest: str, size: int) -> bytearray:
        """The blob's bytes from `node`, checked (PeerUnavailable: it did not deliver)."""
        resp = self._request(node, f"/v1/blobs/{digest}")
        try:
            if resp.status != 200:
                resp.read()
                raise PeerUnavailable(str(resp.status))
            if int(resp.headers.get("Content-Length", -1)) != size:
                self._drop(node)
                raise PeerUnavailable("wrong size")
            body = bytearray(size)
            with memoryview(body) as view:
                got = 0
                while got < size and (n := resp.readinto(view[got:])):
                    got += n
        except (OSError, http.client.HTTPException) as exc:
            self._broken(node)
            raise PeerUnavailable(type(exc).__name__) from None
        if got != size:
            self._broken(node)
            raise PeerUnavailable("short body")
        if hashlib.sha256(body).hexdigest() != digest:
            raise PeerUnavailable("wrong bytes")
        return body

    def close(self) -> None:
        for conn in self._opened:
            conn.close()


# -- one pull ---------------------------------------------------------------------------


def own_stripe(cache: BlobCache, order: dict, plan: SwarmPlan) -> list[str]:
    """The blobs this node's stripe brings in from storage (those it lacks)."""
    return [
        d
        for d, (i, n) in order.items()
        if plan.owner(i) == plan.node and n <= PEER_MAX and cache.locate(d) is None
    ]


def prepare_server(
    server: PeerServer, cache: BlobCache, manifests: list[Manifest], plan: SwarmPlan
) -> None:
    """Grant every input's blobs and expect this node's stripes before any pull starts,
    so a peer ahead of this node (on a later input) waits rather than falls back."""
    for m in manifests:
        order = blob_order(m)
        server.grant(order)
        server.expect(own_stripe(cache, order, plan))


def swarm_materialise(
    cache: BlobCache,
    manifest: Manifest,
    dest: Path,
    storage: Fetch,
    plan: SwarmPlan,
    server: PeerServer | None = None,
    progress: Progress | None = None,
    counts: SwarmCounts | None = None,
) -> tuple[Materialised, SwarmCounts]:
    """`cache.materialise` with the swarm (see the steps above); `server`: this node's
    peer server, told which blobs of the stripe are still coming; `counts`: where to
    count (a caller may watch them while the pull runs)."""
    order = blob_order(manifest)
    counts = SwarmCounts() if counts is None else counts
    fetch = SwarmFetch(plan, order, storage, counts)
    if server is not None:
        server.grant(order)
    mine: list[str] = []
    began = time.monotonic()
    try:
        if not Path(dest).exists():
            mine = own_stripe(cache, order, plan)
            if server is not None:
                server.expect(mine)
            fetch.stripe = _Stripe(cache, mine, fetch, server, progress)
        done = cache.materialise(manifest, dest, fetch, progress)
    finally:
        if fetch.stripe is not None:
            fetch.stripe.close()
            counts.phases["stripe"] = fetch.stripe.took
        counts.phases["pull"] = time.monotonic() - began
        fetch.close()
        if server is not None:
            for d in order:  # whatever happened, nothing of this input is coming any more
                server.settle(d)
    # the stripe's chunks now lie in the files they belong to too (served from there)
    brought = set(mine)
    cache.drop_chunk_copies(d for f in manifest.files for d in f.chunks if d in brought)
    return done, counts


class _Stripe:
    """This node's stripe brought into its cache in the background, up to PREFETCH
    blobs at once, in manifest order, while the input is assembled."""

    def __init__(self, cache: BlobCache, digests, fetch: SwarmFetch, server, progress):
        self.cache, self.fetch, self.server, self.progress = cache, fetch, server, progress
        self.done = {d: threading.Event() for d in digests}
        self.began, self.took = time.monotonic(), 0.0
        self.pool = ThreadPoolExecutor(max(1, min(PREFETCH, len(self.done))))
        for d in self.done:
            self.pool.submit(self._one, d)

    def _one(self, digest: str) -> None:
        try:
            self.cache.ensure_apart(digest, self.fetch.from_storage, self.progress)
        except Exception:  # noqa: BLE001 - the assembly reads it from storage then
            pass
        finally:
            self.took = time.monotonic() - self.began
            self.done[digest].set()
            if self.server is not None:
                self.server.settle(digest)

    def wait(self, digest: str) -> str | None:
        """The cached blob's path once the stripe is done with it; None: not in it."""
        ev = self.done.get(digest)
        if ev is None:
            return None
        ev.wait()
        path = self.cache.path(digest)
        return str(path) if path.exists() else None

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)  # a failed pull stops it
