-- Tokens (issue 9): the same table as migrations/sqlite/0009_agent_tokens.sql.
CREATE TABLE agent_tokens (
    id          text   PRIMARY KEY,
    node        text   NOT NULL,
    role        text   NOT NULL CHECK (role IN ('agent', 'viewer', 'admin')),
    secret_hash bytea  NOT NULL,
    created_ms  bigint NOT NULL,
    revoked_ms  bigint
);

CREATE INDEX agent_tokens_node ON agent_tokens (node);
