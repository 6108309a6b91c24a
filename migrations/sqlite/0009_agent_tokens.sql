-- Agent tokens (issue 9): a token is `gft_<id>_<secret>`; only the SHA-256 of the secret
-- is stored. A token lets an agent write as `node` and nothing else.
CREATE TABLE agent_tokens (
    id          TEXT PRIMARY KEY,      -- public part, shown by `tokens list`
    node        TEXT NOT NULL,         -- the node this token writes as
    secret_hash BLOB NOT NULL,         -- SHA-256 of the secret part
    created_ms  INTEGER NOT NULL,
    revoked_ms  INTEGER                -- NULL while the token is valid
) STRICT;

CREATE INDEX agent_tokens_node ON agent_tokens (node);
