-- Tokens (issue 9): a token is `gft_<id>_<secret>`; only the SHA-256 of the secret is
-- stored. Role 'agent': lets an agent write as `node` and nothing else. Roles 'viewer'
-- (read the dashboard and API) and 'admin' (also change things): `node` is a label
-- saying whom the token is for.
CREATE TABLE agent_tokens (
    id          TEXT PRIMARY KEY,      -- public part, shown by `tokens list`
    node        TEXT NOT NULL,         -- agent: the node it writes as; else a label
    role        TEXT NOT NULL CHECK (role IN ('agent', 'viewer', 'admin')),
    secret_hash BLOB NOT NULL,         -- SHA-256 of the secret part
    created_ms  INTEGER NOT NULL,
    revoked_ms  INTEGER                -- NULL while the token is valid
) STRICT;

CREATE INDEX agent_tokens_node ON agent_tokens (node);
