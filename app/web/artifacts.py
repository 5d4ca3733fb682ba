"""How both doors send back bytes an agent wrote (an artifact, project.md): the headers that
keep a browser from running them, and the piece size of a digest copied through the worker.
The REST API and the console serve the same bytes, so they send them the same way.
"""

from __future__ import annotations

# An artifact is whatever an agent uploaded: a browser that opens one (a link in the
# console, a URL pasted into the address bar) must not sniff it into HTML, run a script in
# it, or let another site embed it.
ARTIFACT_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
    "Cross-Origin-Resource-Policy": "same-origin",
}

# project.md with changes spliced in is copied through the worker (an unchanged one goes
# by sendfile): in pieces this big, the per-piece overhead is noise next to the copy.
DIGEST_CHUNK = 256 * 1024
