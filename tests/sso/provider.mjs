// A real OpenID Connect provider for the tests: node's oidc-provider, on 127.0.0.1.
//
// argv[2] is a JSON file: {"port", "clients": [...], "accounts": "<file>", "idTokenTtl"}.
// The accounts file maps a login to its claims ({"ana": {"email", "name", "groups"}}) and is
// read again at every sign-in, so a test changes a person's groups by rewriting it. The
// login page is one form (a login, no password): what a person types is who they are.
import fs from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;

function accounts() {
  return JSON.parse(fs.readFileSync(config.accounts, 'utf8'));
}

const provider = new Provider(issuer, {
  clients: config.clients,
  findAccount: async (ctx, id) => {
    const found = accounts()[id];
    if (!found) return undefined;
    return { accountId: id, claims: async () => ({ sub: id, ...found }) };
  },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  conformIdTokenClaims: false, // the claims of the asked scopes ride in the ID token
  features: { devInteractions: { enabled: false } },
  pkce: { required: () => true },
  ttl: { IdToken: config.idTokenTtl || 3600 },
  cookies: { keys: ['project-memory tests, not a secret'] },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});
provider.proxy = false;

function body(req) {
  return new Promise((resolve) => {
    let data = '';
    req.on('data', (chunk) => { data += chunk; });
    req.on('end', () => resolve(new URLSearchParams(data)));
  });
}

async function interaction(req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params } = details;
  if (prompt.name === 'login') {
    if (req.method === 'GET') {
      res.setHeader('Content-Type', 'text/html');
      res.end(`<!doctype html><title>Provider sign-in</title><form method="post">
<label for="login">Login</label><input id="login" name="login" autofocus>
<button type="submit" id="go">Sign in at the provider</button></form>`);
      return;
    }
    const login = (await body(req)).get('login');
    if (!accounts()[login]) {
      res.statusCode = 403;
      res.end('no such account');
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    return;
  }
  // consent: granted at once, for the scopes asked
  const grant = new provider.Grant({ accountId: details.session.accountId, clientId: params.client_id });
  grant.addOIDCScope(String(params.scope));
  const grantId = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
}

const callback = provider.callback();
http.createServer((req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((err) => {
      res.statusCode = 500;
      res.end(String(err));
    });
    return;
  }
  callback(req, res);
}).listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`ready ${issuer}\n`);
});
