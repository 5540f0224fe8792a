"""A Colab runtime's outside world, for tools/colab_check.py: installed into its venv.

Python imports sitecustomize at start-up. In a notebook kernel (ipykernel_launcher) started with
COLAB_CHECK_URLS naming a URL map (JSON: {url or url prefix ending in "/": [local folders or
files]}), this module makes the kernel look like Colab's and keeps it off the network:
- `google.colab` is in sys.modules, as the chapters' setup cells and enable_book_charts expect;
- urllib serves each mapped URL from its local copy (a mapped prefix with no such file answers
  404, as the real server would) and refuses every other URL;
- sockets may connect only to loopback addresses, and only loopback names resolve.
Every refusal, and every URL served, is appended as a JSON line to $COLAB_CHECK_LOG, which the
harness reads: a chapter that touched the network outside the map fails even if it caught the
error. Other processes (pip in a setup cell, git) are left alone: Colab's pip reaches PyPI.
"""

from __future__ import annotations

import email.message
import io
import ipaddress
import json
import os
import socket
import sys
import types
import urllib.error
import urllib.request
import urllib.response
from pathlib import Path

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_kernel(argv: list[str]) -> bool:
    """Whether this process is an IPython kernel (`python -m ipykernel_launcher -f ...`)."""
    return any(Path(arg).stem == "ipykernel_launcher" for arg in argv)


def local_copy(url: str, url_map: dict[str, list[str]]) -> tuple[bool, Path | None]:
    """(whether url is mapped, the local file that answers it or None when there is none)."""
    for prefix, targets in url_map.items():
        if url == prefix:
            rest = ""
        elif prefix.endswith("/") and url.startswith(prefix):
            rest = url[len(prefix):].split("?")[0]
        else:
            continue
        if ".." in rest.split("/"):
            return True, None
        for target in targets:
            path = Path(target) / rest if rest else Path(target)
            if path.is_file():
                return True, path
        return True, None
    return False, None


def is_loopback(host: object) -> bool:
    """Whether host (a name or an address) stays on this machine."""
    if not isinstance(host, str):
        return False
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def is_address(host: object) -> bool:
    """Whether host is a literal IP address (looking it up asks no name server)."""
    try:
        ipaddress.ip_address(str(host).split("%")[0])
        return True
    except ValueError:
        return False


class NetworkLog:
    """Appends one JSON line per event to a file (or nowhere when path is None)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def record(self, kind: str, target: str) -> None:
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": kind, "target": target}) + "\n")


class LocalCopies(urllib.request.BaseHandler):
    """Answers http(s) URLs from the map's local copies before any real handler can."""

    handler_order = 100  # before urllib's HTTP(S)Handler (500)

    def __init__(self, url_map: dict[str, list[str]], log: NetworkLog) -> None:
        self.url_map, self.log = url_map, log

    def http_open(self, request: urllib.request.Request) -> urllib.response.addinfourl:
        url = request.full_url
        mapped, path = local_copy(url, self.url_map)
        if not mapped:
            self.log.record("url", url)
            raise urllib.error.URLError(f"colab_check refused {url}: not in the map of local "
                                        "copies (this test allows no other network use)")
        if path is None:
            self.log.record("missing", url)
            raise urllib.error.HTTPError(url, 404, "Not Found", email.message.Message(),
                                         io.BytesIO(b""))
        self.log.record("served", url)
        headers = email.message.Message()
        headers["Content-Length"] = str(path.stat().st_size)
        response = urllib.response.addinfourl(open(path, "rb"), headers, url, 200)
        response.msg = "OK"  # urllib's error processor reads it, as from an HTTP response
        return response

    https_open = http_open


def guard_sockets(log: NetworkLog) -> None:
    """Refuse connections to anything but this machine, and look-ups of names but its own."""
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex
    getaddrinfo = socket.getaddrinfo
    own_name = socket.gethostname()

    def allowed(sock: socket.socket, address: object) -> bool:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return True  # a Unix socket stays on this machine
        return isinstance(address, tuple) and is_loopback(address[0])

    def guarded_connect(self: socket.socket, address: object) -> None:
        if not allowed(self, address):
            log.record("connect", repr(address))
            raise ConnectionRefusedError(f"colab_check refused a connection to {address!r}")
        return connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: object) -> int:
        if not allowed(self, address):
            log.record("connect", repr(address))
            raise ConnectionRefusedError(f"colab_check refused a connection to {address!r}")
        return connect_ex(self, address)

    def guarded_getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
        if host is not None and not (is_loopback(host) or is_address(host) or host == own_name):
            log.record("resolve", str(host))
            raise socket.gaierror(socket.EAI_NONAME, f"colab_check refused to resolve {host}")
        return getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = guarded_connect
    socket.socket.connect_ex = guarded_connect_ex
    socket.getaddrinfo = guarded_getaddrinfo


def pretend_colab() -> None:
    """Put an empty `google.colab` module where Colab has its real one."""
    google = sys.modules.setdefault("google", types.ModuleType("google"))
    if not hasattr(google, "__path__"):
        google.__path__ = []
    colab = types.ModuleType("google.colab")
    google.colab = colab
    sys.modules["google.colab"] = colab


def activate(map_path: str, log_path: str | None) -> None:
    """Make this process Colab-like and keep it to the map's local copies."""
    url_map = json.loads(Path(map_path).read_text(encoding="utf-8"))
    log = NetworkLog(log_path)
    pretend_colab()
    urllib.request.install_opener(urllib.request.build_opener(LocalCopies(url_map, log)))
    guard_sockets(log)


if os.environ.get("COLAB_CHECK_URLS") and is_kernel(getattr(sys, "orig_argv", sys.argv)):
    activate(os.environ["COLAB_CHECK_URLS"], os.environ.get("COLAB_CHECK_LOG"))
