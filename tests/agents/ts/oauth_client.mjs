// The MCP TypeScript SDK's OAuth flow against /mcp, driven by tests/agents/test_oauth_ts_sdk.py.
//
//   node oauth_client.mjs <mcp url> <redirect uri> <client metadata url or "-"> <wait seconds>
//
// Prints one JSON line per step on stdout. It prints the authorization URL, then reads the URL
// the browser was redirected to from stdin. It calls record_turn and search, waits for the
// access token to expire, and searches again; the SDK refreshes on the 401.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";
import { createInterface } from "node:readline";
import { randomBytes } from "node:crypto";

const [url, redirect, metadataUrl, wait] = process.argv.slice(2);
const say = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

class Provider {
  constructor() {
    this.saved = {};
    this.seen = [];
    if (metadataUrl !== "-") this.clientMetadataUrl = metadataUrl;
  }
  get redirectUrl() { return redirect; }
  get clientMetadata() {
    return {
      client_name: "TS SDK test client",
      redirect_uris: [redirect],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  state() { return randomBytes(16).toString("hex"); }
  clientInformation() { return this.saved.client; }
  saveClientInformation(info) { this.saved.client = info; }
  tokens() { return this.saved.tokens; }
  saveTokens(tokens) { this.saved.tokens = tokens; this.seen.push(tokens.refresh_token); }
  redirectToAuthorization(authorizationUrl) { say({ authorize: authorizationUrl.toString() }); }
  saveCodeVerifier(verifier) { this.saved.verifier = verifier; }
  codeVerifier() { return this.saved.verifier; }
}

const provider = new Provider();
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const connect = async () => {
  const client = new Client({ name: "ts-oauth-test", version: "1.0.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider }));
  return client;
};

let client;
try {
  client = await connect();
} catch (error) {
  if (!(error instanceof UnauthorizedError)) throw error;
  const landed = new URL((await lines.next()).value);
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await transport.finishAuth(landed.searchParams.get("code"));
  say({ iss: landed.searchParams.get("iss") });
  client = await connect();
}
const text = (result) => result.content.map((c) => c.text).join("");
const recorded = await client.callTool({
  name: "record_turn",
  arguments: { task_id: "ts-oauth-task", summary_md: "session TTL fix" },
});
const first = await client.callTool({ name: "search", arguments: { query: "session" } });
await new Promise((resolve) => setTimeout(resolve, Number(wait) * 1000));
const second = await client.callTool({ name: "search", arguments: { query: "session" } });
say({
  client_id: provider.saved.client.client_id,
  recorded_error: Boolean(recorded.isError),
  first: text(first),
  second: text(second),
  refresh_tokens: provider.seen,
});
await client.close();
process.exit(0);
