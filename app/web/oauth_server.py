"""The OAuth 2.1 authorization server for ``/mcp``, in this app, on authlib.

authlib does the protocol: parsing and checking authorization and token requests, client
authentication at the token and revocation endpoints, PKCE (S256 only here), RFC 9207's
``iss`` in the authorization response, RFC 7591 registration's metadata checks, and the RFC
9068 JWT access tokens (signed with joserfc). Ours are the models and rules around it: who a
client is (oauth_clients.py), the grants (services/oauth.py over core/oauth.py), RFC 8707's
``resource``, and checking an access token at ``/mcp``.

Access tokens are JWTs (``typ: at+jwt``, HS256 with the deployment's ``.oauth-key``):
``aud`` is this server's ``/mcp`` URL, ``sub`` the parent token, ``grant`` the grant. They
live ``MEMORY_OAUTH_ACCESS_SECONDS`` (at most an hour), and every request also checks the
grant (read again at most a second after the worker last read it) and its parent token, so a
revoked grant stops them within a second and a revoked parent at their next request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from authlib.common.security import generate_token
from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import grants
from authlib.oauth2.rfc6749.errors import InvalidRequestError, OAuth2Error
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7591 import ClientMetadataClaims, ClientRegistrationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from authlib.oauth2.rfc9207 import IssuerParameter
from flask import Flask, current_app, request
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import OctKey

from app.services import oauth as grants_service
from app.services.access import Principal
from app.storage.core.clock import Clock
from app.storage.core.names import OAUTH_KEY, Scope
from app.storage.core.oauth import (
    CODE_PREFIX,
    REFRESH_PREFIX,
    Grant,
    grant_of,
    new_client,
    new_client_id,
    new_client_secret,
)
from app.storage.interface import StorageBackend, TokenStore
from app.web.oauth_clients import (
    SCOPE,
    ClientError,
    DocumentCache,
    OAuthClient,
    check_redirect_uri,
    document_client,
    registered_client,
)
from app.web.origins import forwarded, request_origin

ALGORITHM = "HS256"
MCP_PATH = "/mcp"
AUTHORIZE_PATH = "/console/oauth/authorize"
TOKEN_PATH = "/oauth/token"  # noqa: S105 - a path
REVOKE_PATH = "/oauth/revoke"
REGISTER_PATH = "/oauth/register"
RESOURCE_METADATA_PATH = "/.well-known/oauth-protected-resource"
SERVER_METADATA_PATH = "/.well-known/oauth-authorization-server"
AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]


# -- where we are ---------------------------------------------------------------------------
def issuer() -> str:
    """This server's issuer identifier: ``MEMORY_PUBLIC_URL``, else the origin asked."""
    public: str = current_app.config.get("PUBLIC_URL", "")
    return public or request_origin()


def resource() -> str:
    """The canonical URL of ``/mcp`` (RFC 8707's resource, the tokens' audience)."""
    return issuer() + MCP_PATH


def resource_metadata_url() -> str:
    return issuer() + RESOURCE_METADATA_PATH + MCP_PATH


def _storage() -> StorageBackend:
    found: StorageBackend = current_app.extensions["storage"]
    return found


def _registry() -> TokenStore:
    found: TokenStore = current_app.extensions["token_registry"]
    return found


def _clock() -> Clock:
    return _registry().clock


def _key() -> OctKey:
    found: OctKey | None = current_app.extensions.get("oauth_key")
    if found is None:
        found = OctKey.import_key(_storage().key(OAUTH_KEY))
        current_app.extensions["oauth_key"] = found
    return found


def _access_seconds() -> int:
    seconds: int = current_app.config["OAUTH_ACCESS_SECONDS"]
    return seconds


def _grant_lifetime() -> timedelta:
    return timedelta(days=current_app.config["OAUTH_GRANT_DAYS"])


def described(text: str) -> str:
    """``text`` as an OAuth ``error_description`` may carry it (RFC 6749 §5.2: printable
    ASCII but '"' and '\\'); anything else becomes '?'."""
    return "".join(ch if 0x20 <= ord(ch) <= 0x7E and ch not in '"\\' else "?" for ch in text)


# -- clients --------------------------------------------------------------------------------
def query_client(client_id: str) -> OAuthClient | None:
    """The client ``client_id`` names: a document's URL, or a client registered here."""
    if not isinstance(client_id, str) or not client_id:
        return None
    if client_id.startswith("https://"):
        try:
            return document_client(
                client_id,
                current_app.extensions["oauth_documents"],
                allow_private=current_app.config["OAUTH_CIMD_PRIVATE"],
                ca_file=current_app.config["OAUTH_CIMD_CA_FILE"],
            )
        except ClientError as exc:
            raise InvalidRequestError(described(f"client {client_id[:200]}: {exc}")) from None
    record = _storage().oauth.client(client_id)
    return None if record is None else registered_client(record)


# -- the person behind a code or refresh token ---------------------------------------------
@dataclass(frozen=True, slots=True)
class GrantUser:
    """The resource owner as authlib carries it: the grant (made or spent)."""

    grant: Grant

    def get_user_id(self) -> str:
        return self.grant.token_id


@dataclass(frozen=True, slots=True)
class Consent:
    """What the person approved on the consent page (the role and the project)."""

    by: Any  # the signed-in Token
    tenant: str
    project: str
    role: str

    def get_user_id(self) -> str:
        return str(self.by.id)


@dataclass(frozen=True, slots=True)
class SpentCode:
    """A spent authorization code, as authlib's code grant reads it."""

    grant: Grant

    def get_redirect_uri(self) -> str:
        return self.grant.redirect_uri

    def get_scope(self) -> str:
        return self.grant.scope

    def get_nonce(self) -> None:
        return None

    def get_auth_time(self) -> None:
        return None

    @property
    def code_challenge(self) -> str:
        return self.grant.code_challenge

    @property
    def code_challenge_method(self) -> str:
        return "S256"


@dataclass(frozen=True, slots=True)
class SpentRefresh:
    """A spent refresh token, as authlib's refresh grant reads it."""

    grant: Grant

    def check_client(self, client: OAuthClient) -> bool:
        return client.get_client_id() == self.grant.client_id

    def get_scope(self) -> str:
        return self.grant.scope

    def get_expires_in(self) -> int:
        return 0

    def is_expired(self) -> bool:
        return False

    def is_revoked(self) -> bool:
        return False


def _check_resource(grant: Grant | None = None) -> str:
    """RFC 8707: the ``resource`` asked for must be this server's ``/mcp``."""
    asked = request.values.get("resource")
    ours = resource()
    if asked is None:
        return ours if grant is None else grant.resource
    if asked.rstrip("/") != ours or (grant is not None and asked.rstrip("/") != grant.resource):
        raise InvalidTarget(f"this server issues tokens for {ours} only")
    return ours


def _spend(secret: str, prefix: str, client: OAuthClient) -> Grant | None:
    """The grant a code or refresh token (of ``prefix``) of ``client`` is exchanged for,
    spent under the grant's lock; None when it may not be. A spent grant asked for another
    resource is refused (invalid_target)."""
    if grant_of(secret, prefix) is None:
        return None
    spent = grants_service.spend(
        _storage(), _registry(), secret, client_id=client.get_client_id(), now=_clock()()
    )
    if spent is not None:
        _check_resource(spent)
    return spent


class InvalidTarget(OAuth2Error):  # type: ignore[misc]
    """RFC 8707 §2: the resource asked for is not one this server issues tokens for."""

    error = "invalid_target"


# -- grants ---------------------------------------------------------------------------------
class S256Only(CodeChallenge):  # type: ignore[misc]
    """PKCE required, and S256 only: a missing challenge, ``plain``, or no method (which
    RFC 7636 reads as ``plain``) are refused."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]
    DEFAULT_CODE_CHALLENGE_METHOD = "S256"

    def validate_code_challenge(self, grant: Any, redirect_uri: str) -> None:
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("PKCE is required: send code_challenge (S256)")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("code_challenge_method must be S256")
        super().validate_code_challenge(grant, redirect_uri)


class CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS

    def validate_authorization_request(self) -> str:
        redirect_uri: str = super().validate_authorization_request()
        try:
            _check_resource()
        except InvalidTarget as exc:
            exc.redirect_uri = redirect_uri
            raise
        return redirect_uri

    def generate_authorization_code(self) -> str:
        consent: Consent = self.request.user
        payload = self.request.payload
        _, code = grants_service.consent(
            _storage(),
            consent.by,
            grants_service.ConsentRequest(
                client_id=self.request.client.get_client_id(),
                client_name=self.request.client.client_name,
                redirect_uri=payload.redirect_uri,
                scope=SCOPE,
                resource=_check_resource(),
                code_challenge=payload.data["code_challenge"],
            ),
            Scope(consent.tenant, consent.project),
            consent.role,
            now=_clock()(),
            lifetime=_grant_lifetime(),
        )
        return code

    def save_authorization_code(self, code: str, request: Any) -> None:
        """Kept by :meth:`generate_authorization_code`, with the grant it belongs to."""

    def query_authorization_code(self, code: str, client: OAuthClient) -> SpentCode | None:
        spent = _spend(code, CODE_PREFIX, client)
        return None if spent is None else SpentCode(spent)

    def delete_authorization_code(self, authorization_code: SpentCode) -> None:
        """Spent already, under the grant's lock, when it was looked up."""

    def authenticate_user(self, authorization_code: SpentCode) -> GrantUser:
        return GrantUser(authorization_code.grant)


class RefreshGrant(grants.RefreshTokenGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = AUTH_METHODS
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token: str) -> SpentRefresh | None:
        spent = _spend(refresh_token, REFRESH_PREFIX, self.request.client)
        return None if spent is None else SpentRefresh(spent)

    def authenticate_user(self, refresh_token: SpentRefresh) -> GrantUser:
        return GrantUser(refresh_token.grant)

    def revoke_old_credential(self, refresh_token: SpentRefresh) -> None:
        """Retired already, when it was spent."""


class AccessTokens(JWTBearerTokenGenerator):  # type: ignore[misc]
    """RFC 9068 access tokens for ``/mcp``, and the grant's rotating refresh tokens."""

    def __init__(self) -> None:
        super().__init__(
            issuer="",
            alg=ALGORITHM,
            refresh_token_generator=self._refresh_token,
            expires_generator=lambda client, grant_type: _access_seconds(),
        )

    def access_token_generator(
        self, client: Any, grant_type: str, user: GrantUser, scope: str
    ) -> str:
        # RFC 9068's claims, timed by the deployment's clock (the one every check reads).
        now = int(_clock()().timestamp())
        claims = {
            "iss": issuer(),
            "aud": user.grant.resource,
            "sub": user.get_user_id(),
            "client_id": client.get_client_id(),
            "scope": scope,
            "iat": now,
            "exp": now + _access_seconds(),
            "jti": generate_token(16),
            "grant": user.grant.id,
        }
        token: str = jwt.encode({"alg": ALGORITHM, "typ": "at+jwt"}, claims, _key())
        return token

    @staticmethod
    def _refresh_token(client: Any, grant_type: str, user: GrantUser, scope: str) -> str:
        return grants_service.issue_refresh_token(
            _storage(),
            user.grant,
            now=_clock()(),
            lifetime=_grant_lifetime(),
            refreshed=grant_type == "refresh_token",
        )


class Revocation(RevocationEndpoint):  # type: ignore[misc]
    """RFC 7009: revoking either token of a grant ends the grant."""

    CLIENT_AUTH_METHODS = AUTH_METHODS

    def query_token(self, token_string: str, token_type_hint: str | None) -> SpentRefresh | None:
        grant_id = grant_of(token_string, REFRESH_PREFIX)
        if grant_id is None:
            claims = _claims(token_string)
            grant_id = None if claims is None else str(claims.get("grant", ""))
        found = None if not grant_id else grants_service.find(_storage(), grant_id)
        return None if found is None else SpentRefresh(found)

    def revoke_token(self, token: SpentRefresh, request: Any) -> None:
        if token.grant.revoked_at is None:
            grants_service.revoke(_storage(), None, token.grant.id, now=_clock()())


class Registration(ClientRegistrationEndpoint):  # type: ignore[misc]
    """RFC 7591, open to anyone (rate-limited per address by the view): a client gets
    nothing by registering until a person consents."""

    def authenticate_token(self, request: Any) -> bool:
        return True

    def get_server_metadata(self) -> dict[str, Any]:
        return server_metadata()

    def create_registration_response(self, request: Any) -> tuple[int, Any, Any]:
        status, body, headers = super().create_registration_response(request)
        if body.get("client_secret") is None:  # a public client: no secret to speak of
            body.pop("client_secret", None)
            body.pop("client_secret_expires_at", None)
        return status, body, headers

    def generate_client_id(self, request: Any) -> str:
        return new_client_id()

    def generate_client_secret(self, request: Any) -> str | None:
        method = request.payload.data.get("token_endpoint_auth_method", "client_secret_basic")
        return None if method == "none" else new_client_secret()

    def save_client(
        self, client_info: dict[str, Any], client_metadata: dict[str, Any], request: Any
    ) -> OAuthClient:
        uris = client_metadata.get("redirect_uris") or []
        if not isinstance(uris, list) or not uris or len(uris) > 20:
            raise InvalidClientMetadata("redirect_uris: 1 to 20 URIs are required")
        try:
            checked = tuple(check_redirect_uri(u) for u in uris)
        except ClientError as exc:
            raise InvalidClientMetadata(described(str(exc))) from None
        method = client_metadata.get("token_endpoint_auth_method", "client_secret_basic")
        if method not in AUTH_METHODS:
            raise InvalidClientMetadata(f"token_endpoint_auth_method must be one of {AUTH_METHODS}")
        for grant_type in client_metadata.get("grant_types") or ["authorization_code"]:
            if grant_type not in ("authorization_code", "refresh_token"):
                raise InvalidClientMetadata(f"grant type {grant_type} is not supported")
        record = new_client(
            _clock()(),
            client_id=client_info["client_id"],
            secret=client_info.get("client_secret"),
            client_name=str(client_metadata.get("client_name") or "")[:200],
            redirect_uris=checked,
            auth_method=method,
            registered_from=request_address(),
            client_uri=str(client_metadata.get("client_uri") or "")[:500],
        )
        _storage().oauth.add_client(record)
        return registered_client(record)


class InvalidClientMetadata(OAuth2Error):  # type: ignore[misc]
    error = "invalid_client_metadata"


def request_address() -> str:
    return forwarded("X-Forwarded-For") or request.remote_addr or ""


# -- the server -----------------------------------------------------------------------------
def init_app(app: Flask) -> None:
    server = AuthorizationServer(query_client=query_client, save_token=lambda token, req: None)
    server.init_app(app)
    server.register_token_generator("default", AccessTokens())
    server.register_grant(CodeGrant, [S256Only(required=True)])
    server.register_grant(RefreshGrant)
    server.register_endpoint(Revocation)
    server.register_endpoint(Registration(claims_classes=[ClientMetadataClaims]))
    server.register_extension(_Issuer())
    app.extensions["oauth_server"] = server
    app.extensions["oauth_documents"] = DocumentCache()


class _Issuer(IssuerParameter):  # type: ignore[misc]
    def get_issuer(self) -> str:
        return issuer()


def server() -> AuthorizationServer:
    found: AuthorizationServer = current_app.extensions["oauth_server"]
    return found


def server_metadata() -> dict[str, Any]:
    """RFC 8414."""
    base = issuer()
    return {
        "issuer": base,
        "authorization_endpoint": base + AUTHORIZE_PATH,
        "token_endpoint": base + TOKEN_PATH,
        "revocation_endpoint": base + REVOKE_PATH,
        "registration_endpoint": base + REGISTER_PATH,
        "scopes_supported": [SCOPE],
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": AUTH_METHODS,
        "revocation_endpoint_auth_methods_supported": AUTH_METHODS,
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": True,
        "service_documentation": base + "/docs",
    }


def resource_metadata() -> dict[str, Any]:
    """RFC 9728."""
    return {
        "resource": resource(),
        "authorization_servers": [issuer()],
        "scopes_supported": [SCOPE],
        "bearer_methods_supported": ["header"],
        "resource_name": "Project Memory",
        "resource_documentation": issuer() + "/docs",
    }


def challenge(error: str | None = None) -> str:
    """The ``WWW-Authenticate`` value of a 401 from ``/mcp``."""
    parts = [f'resource_metadata="{resource_metadata_url()}"', f'scope="{SCOPE}"']
    if error:
        parts.insert(0, f'error="{error}"')
    return "Bearer " + ", ".join(parts)


# -- access tokens at /mcp ------------------------------------------------------------------
def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and value.startswith("eyJ")


# Access tokens whose signature this worker has checked, by their text: a client sends the
# same one for up to an hour. Only the signature is remembered; the expiry, the audience, the
# grant and its parent are checked at every request.
_VERIFIED: OrderedDict[str, dict[str, Any]] = OrderedDict()
_VERIFIED_MAX = 1024
_VERIFIED_LOCK = threading.Lock()


def _verified(value: str) -> dict[str, Any] | None:
    with _VERIFIED_LOCK:
        found = _VERIFIED.get(value)
        if found is not None:
            _VERIFIED.move_to_end(value)
            return found
    try:
        token = jwt.decode(value, _key(), algorithms=[ALGORITHM])
    except (JoseError, ValueError):
        return None
    if token.header.get("typ") != "at+jwt":
        return None
    claims: dict[str, Any] = dict(token.claims)
    with _VERIFIED_LOCK:
        _VERIFIED[value] = claims
        while len(_VERIFIED) > _VERIFIED_MAX:
            _VERIFIED.popitem(last=False)
    return claims


def _claims(value: str, now: datetime | None = None) -> dict[str, Any] | None:
    """The claims of an access token this server signed, issued by it; None otherwise, or
    when it expired by ``now`` (None: expiry not checked)."""
    claims = _verified(value)
    if claims is None or claims.get("iss") != issuer():
        return None
    if now is not None:
        exp = claims.get("exp")
        if not isinstance(exp, int) or exp <= int(now.timestamp()):
            return None
    return claims


def authenticate_access_token(value: str) -> tuple[Principal | None, str]:
    """The principal an OAuth access token acts as at ``/mcp``, or None and why not."""
    now = _clock()()
    claims = _claims(value, now)
    if claims is None:
        return None, "invalid or expired OAuth access token"
    ours = resource()
    if claims.get("aud") != ours:
        return None, f"this access token is for another resource, not {ours}"
    grant_id = claims.get("grant")
    if not isinstance(grant_id, str):
        return None, "invalid OAuth access token"
    principal = grants_service.principal_of(_storage(), _registry(), grant_id, now=now)
    if principal is None:
        return None, "the grant behind this access token was revoked or has ended"
    return principal, ""


def path_is_mcp() -> bool:
    return request.path.endswith(MCP_PATH)
