// A real OpenID provider for the single sign-on tests: oidc-provider (package.json), on a
// loopback port, with one confidential client that must use PKCE (S256).
//
//   node tests/support/oidc_provider.mjs CONFIG.json
//
// CONFIG.json: {"port": 0, "client": {"client_id", "client_secret", "redirect_uris",
// "post_logout_redirect_uris"}, "users_file": PATH, "id_token_ttl_s": 60}. The people
// are read from users_file at every look-up, {"<sub>": {"email", "email_verified",
// "groups", "preferred_username"}}, so a test changes someone's groups by rewriting that
// file. Sign-in uses oidc-provider's development login and consent pages: the login typed
// is the sub (any password). Prints "listening <issuer>" once it accepts connections.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import Provider from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));

function people() {
  return JSON.parse(readFileSync(config.users_file, 'utf8'));
}

const server = createServer();
server.listen(config.port || 0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [
      {
        ...config.client,
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
      },
    ],
    pkce: { required: () => true },
    scopes: ['openid', 'email', 'profile', 'groups'],
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['preferred_username', 'name'],
      groups: ['groups'],
    },
    ttl: { IdToken: config.id_token_ttl_s || 60, AccessToken: 60, AuthorizationCode: 60 },
    async findAccount(ctx, sub) {
      if (!Object.prototype.hasOwnProperty.call(people(), sub)) return undefined;
      return {
        accountId: sub,
        // Read again when the claims are asked for: a group removed counts at once.
        async claims() {
          return { ...people()[sub], sub };
        },
      };
    },
  });
  provider.on('server_error', (ctx, error) => console.error('server_error', error));
  server.on('request', provider.callback());
  console.log(`listening ${issuer}`);
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
