"""Whether `camrender play` can listen where it is asked to, found before the model loads (minutes on a GPU):
an address no interface of this machine has, a port another program holds, a name that does not resolve."""
from __future__ import annotations

import errno
import socket

from camrender.errors import CamrenderError


def check_listen(host: str, port: int) -> None:
    """CamrenderError (field "host" or "port") unless a TCP socket can bind `host`:`port` (0: any free port),
    as the server binds it later (every address the name resolves to, SO_REUSEADDR as aiohttp sets it);
    the sockets are closed again."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as error:
        reason = getattr(error, "strerror", None) or error
        raise CamrenderError(f"cannot listen on {host!r}: {reason}", field="host") from None
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                raise _bind_error(host, port, error) from None


def _bind_error(host: str, port: int, error: OSError) -> CamrenderError:
    if error.errno == errno.EADDRINUSE:
        return CamrenderError(f"port {port} on {host} is in use by another program (pick another --port, or 0 for "
                              f"any free one)", field="port")
    if error.errno == errno.EADDRNOTAVAIL:
        return CamrenderError(f"{host} is not an address of this machine (no interface has it)", field="host")
    if error.errno == errno.EACCES:
        return CamrenderError(f"port {port} needs privileges to listen on (use a port from 1024)", field="port")
    return CamrenderError(f"cannot listen on {host} port {port}: {error.strerror or error}", field="host")
