"""Errors. Bad arguments are ValueError/TypeError, raised before any byte moves; failures
while data moves are CollectiveError or its subclasses, and name the operation, this rank,
the peer and the step."""


class CollectiveError(RuntimeError):
    """A collective failed after it started (mismatch seen on the wire, peer failure...)."""


class CollectiveTimeout(CollectiveError, TimeoutError):
    """A bounded wait ran out: the peer never sent, or never received."""


class TransportError(CollectiveError):
    """The transport itself failed: a peer died, a connection broke, a frame was malformed."""


# torch's words for a timeout: gloo's messages say "Timed out ...", and code and torch's own
# tests match them (" (Timed out|closed|timeout) "), so every timeout of ours says them too.
TIMED_OUT = "Timed out"
