"""Python SDK of cagebox: sandboxes for untrusted code whose credentials never
enter the guest.

    import cagebox

    cb = cagebox.Cagebox()            # $CAGEBOX_HOME/cagebox.sock, or CAGEBOX_HOST + CAGEBOX_API_KEY
    with cb.create(image="default", allow=["api.github.com"]) as sb:
        r = sb.exec("echo hello", on_stdout=print)
        print(r.exit_code)

Standard library only. See README.md.
"""

from .client import (
    Approvals,
    Cagebox,
    EventStream,
    ExecResult,
    ExecStream,
    Files,
    NamedPolicies,
    Output,
    Policy,
    Record,
    Sandbox,
    Secrets,
    Snapshots,
    Tenants,
    Tools,
)
from ._tar import UnsafeArchive
from .pty import Pty
from .errors import (
    CageboxError,
    Conflict,
    ConnectionFailed,
    Denied,
    InternalError,
    Invalid,
    NotFound,
    Unauthorized,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "Approvals", "Cagebox", "EventStream", "ExecResult", "ExecStream", "Files", "NamedPolicies", "Output",
    "Policy", "Pty", "Record", "Sandbox", "Secrets", "Snapshots", "Tenants", "Tools", "UnsafeArchive",
    "CageboxError", "Conflict", "ConnectionFailed", "Denied", "InternalError", "Invalid", "NotFound",
    "Unauthorized", "Unavailable",
]
