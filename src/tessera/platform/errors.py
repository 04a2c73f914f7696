"""Errors the platform raises. Each names what was wrong and how to fix it."""

from __future__ import annotations


class PlatformError(Exception):
    """Base class of every platform error."""


class SpecError(PlatformError, ValueError):
    """A run spec is invalid; the message lists every problem, one per line."""


class RunExists(SpecError):
    """The team (the platform home) already has a run of that name."""


class SecretError(PlatformError):
    """A secret is missing, malformed or cannot be stored."""


class SecretExists(SecretError):
    """The team already has a secret of that name (and the write did not ask to replace it)."""


class SecretNotFound(SecretError, LookupError):
    """No secret has the given name."""


class ClusterError(PlatformError):
    """A cluster is unknown, misconfigured, or its scheduler refused a request."""


class ClusterNotFound(ClusterError, LookupError):
    """No cluster has the given name."""


class RunNotFound(PlatformError, LookupError):
    """No run has the given name or id."""


class RunStateError(PlatformError):
    """The run cannot do what was asked in its current status (e.g. moving a finished run)."""


class RunFailed(PlatformError):
    """`wait_for_run_status` saw the run end in a status other than the one waited for."""

    def __init__(self, message: str, run: object | None = None) -> None:
        super().__init__(message)
        self.run = run


class AccountError(PlatformError):
    """A team, user or key cannot be made or found."""


class AccountExists(AccountError):
    """The team or user exists already."""


class AccountNotFound(AccountError, LookupError):
    """No such user, or no key with that prefix."""


class RemoteError(PlatformError):
    """The server could not be reached, or answered something other than what the API promises."""


class NotAuthorised(RemoteError):
    """The server refused the API key (401) or the action for this user (403)."""


class ServerUnreachable(RemoteError):
    """No answer from the server's URL (refused, unresolvable, timed out)."""
