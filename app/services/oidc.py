"""Signing in through an OpenID Connect provider: the authorization code flow with PKCE,
``state`` and ``nonce``, and the ID token's checks, all by authlib and joserfc (nothing here
parses or verifies a JWT by hand).

* Discovery: ``<issuer>/.well-known/openid-configuration``, whose ``issuer`` must be the
  configured one, read once per process (and the key set again when a token names a key
  it does not hold: the provider rotated its keys).
* The request: authlib's ``OAuth2Session`` writes the authorization URL with a fresh
  ``state``, ``nonce`` and S256 code challenge; the door keeps the three in a signed,
  short-lived cookie (:class:`Pending`).
* The answer: ``state`` must be the one sent; authlib exchanges the code (with the PKCE
  verifier and the client secret); the ID token is verified against the provider's keys
  with the configured algorithms only (so neither ``alg: none`` nor an HS256 token keyed
  with the client secret is taken when RS256 is configured), and its claims by authlib's
  ``CodeIDToken``: issuer, audience, expiry and issue time within the clock skew allowed,
  ``nonce``, ``azp`` and ``at_hash``.

No Flask here: the console's pages (app/console/oidc.py) call it.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc6749.errors import OAuth2Error
from authlib.oidc.core import CodeIDToken
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

HTTP_TIMEOUT = 10.0


class SignInRefused(Exception):
    """The provider's answer is not taken; the message says why (for the page and the log)."""


class ProviderUnavailable(Exception):
    """The provider could not be reached or answered nonsense."""


@dataclass(frozen=True, slots=True)
class Settings:
    issuer: str
    client_id: str
    client_secret: str
    scopes: str
    algorithms: tuple[str, ...]
    clock_skew: int


@dataclass(frozen=True, slots=True)
class Pending:
    """What a sign-in under way must get back: kept by the browser, signed by us."""

    state: str
    nonce: str
    verifier: str


class Provider:
    """One configured provider: its metadata and keys, fetched once per process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._metadata: dict[str, Any] | None = None
        self._jwks: dict[str, Any] | None = None

    # -- discovery ---------------------------------------------------------------------------
    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            answer = requests.get(url, timeout=HTTP_TIMEOUT, allow_redirects=False)
            answer.raise_for_status()
            found = answer.json()
        except (requests.RequestException, ValueError) as exc:
            raise ProviderUnavailable(f"{url}: {exc}") from None
        if not isinstance(found, dict):
            raise ProviderUnavailable(f"{url}: not a JSON object")
        return found

    def metadata(self) -> dict[str, Any]:
        with self._lock:
            if self._metadata is not None:
                return self._metadata
        issuer = self.settings.issuer
        found = self._get_json(issuer.rstrip("/") + "/.well-known/openid-configuration")
        # OpenID Connect Discovery §4.3: the document's issuer is exactly the one asked.
        if found.get("issuer") != issuer:
            raise ProviderUnavailable(
                f"the provider's discovery document names issuer {found.get('issuer')!r},"
                f" not {issuer!r}"
            )
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(found.get(key), str):
                raise ProviderUnavailable(f"the provider's discovery document has no {key}")
        with self._lock:
            self._metadata = found
        return found

    def keys(self, *, refresh: bool = False) -> KeySet:
        with self._lock:
            cached = None if refresh else self._jwks
        if cached is None:
            cached = self._get_json(self.metadata()["jwks_uri"])
            with self._lock:
                self._jwks = cached
        try:
            return KeySet.import_key_set(cached)  # type: ignore[arg-type]
        except (JoseError, ValueError, TypeError) as exc:
            raise ProviderUnavailable(f"the provider's key set: {exc}") from None

    def _session(self, redirect_uri: str) -> OAuth2Session:
        return OAuth2Session(
            client_id=self.settings.client_id,
            client_secret=self.settings.client_secret,
            scope=self.settings.scopes,
            redirect_uri=redirect_uri,
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_basic",  # noqa: S106 - a method's name
        )

    # -- the flow ----------------------------------------------------------------------------
    def begin(self, redirect_uri: str) -> tuple[str, Pending]:
        """The URL to send the browser to, and what its answer must match."""
        pending = Pending(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=secrets.token_urlsafe(48),
        )
        with self._session(redirect_uri) as session:
            url, _ = session.create_authorization_url(
                self.metadata()["authorization_endpoint"],
                state=pending.state,
                nonce=pending.nonce,
                code_verifier=pending.verifier,
            )
        return url, pending

    def finish(
        self, redirect_uri: str, pending: Pending, answer: dict[str, str], *, now: float
    ) -> dict[str, Any]:
        """The checked ID token claims of the provider's ``answer`` (the callback's query)."""
        state = answer.get("state", "")
        if not hmac.compare_digest(state.encode(), pending.state.encode()):
            raise SignInRefused("the sign-in's state does not match: start again")
        if "error" in answer:
            raise SignInRefused(f"the provider refused: {answer['error'][:100]}")
        code = answer.get("code", "")
        if not code:
            raise SignInRefused("the provider's answer has no code")
        try:
            with self._session(redirect_uri) as session:
                tokens = session.fetch_token(
                    self.metadata()["token_endpoint"],
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=pending.verifier,
                    timeout=HTTP_TIMEOUT,
                )
        except OAuth2Error as exc:
            raise SignInRefused(f"the provider refused the code: {exc.error}") from None
        except requests.RequestException as exc:
            raise ProviderUnavailable(f"the token endpoint: {exc}") from None
        raw = tokens.get("id_token")
        if not isinstance(raw, str):
            raise SignInRefused("the provider sent no ID token")
        return self.check_id_token(
            raw, nonce=pending.nonce, access_token=tokens.get("access_token"), now=now
        )

    def check_id_token(
        self, raw: str, *, nonce: str, access_token: str | None = None, now: float | None = None
    ) -> dict[str, Any]:
        """The claims of ``raw`` once its signature, algorithm and claims are checked."""
        algorithms = list(self.settings.algorithms)
        try:
            try:
                token = jwt.decode(raw, self.keys(), algorithms=algorithms)
            except InvalidKeyIdError:  # keys rotated since they were read: read them again
                token = jwt.decode(raw, self.keys(refresh=True), algorithms=algorithms)
        except JoseError as exc:
            raise SignInRefused(f"the ID token is refused: {exc.error}") from None
        except ValueError as exc:  # not a JWT at all
            raise SignInRefused(f"the ID token is refused: {exc}") from None
        params: dict[str, Any] = {"nonce": nonce, "client_id": self.settings.client_id}
        if access_token:
            params["access_token"] = access_token
        claims = CodeIDToken(
            token.claims,
            token.header,
            {
                "iss": {"essential": True, "value": self.settings.issuer},
                "aud": {"essential": True, "value": self.settings.client_id},
                "sub": {"essential": True},
                "exp": {"essential": True},
                "nonce": {"essential": True},
            },
            params,
        )
        try:
            claims.validate(
                now=int(time.time() if now is None else now), leeway=self.settings.clock_skew
            )
        except JoseError as exc:
            raise SignInRefused(
                f"the ID token is refused: {exc.error}: {exc.description}"
            ) from None
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise SignInRefused("the ID token names no subject")
        return dict(claims)
