//! Tokens: `gft_<id>_<secret>`, managed with `gpufleet-collector tokens add|list|revoke`.
//! An `agent` token writes as one node (one or more per node); a `viewer` token reads
//! the dashboard and API; an `admin` token may also change things (non-GET requests).
//!
//! The id is public (listed, used to revoke); the secret is 256 random bits shown once, at
//! `add`. The store keeps only the secret's SHA-256 (a fast hash is enough: the secret is
//! random, not a password), and the check compares hashes in constant time.

use crate::store::{self, AgentTokenRecord, StoreError, TokenStore};
use gpufleet_core::UnixMs;
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt::Write as _;
use subtle::ConstantTimeEq as _;

/// What every token starts with (so leaked tokens are easy to scan for).
pub const PREFIX: &str = "gft_";

/// Why a token command failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the system's random number generator failed")]
    Random,
    #[error("{0}")]
    Invalid(String),
}

/// A token just made: the secret is shown once and never stored.
pub struct NewToken {
    pub token: String,
    pub record: AgentTokenRecord,
}

impl std::fmt::Debug for NewToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewToken")
            .field("token", &"***")
            .field("record", &self.record)
            .finish()
    }
}

fn random_hex(bytes: usize) -> Result<String, TokenError> {
    let mut buf = vec![0u8; bytes];
    SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| TokenError::Random)?;
    let mut s = String::with_capacity(bytes * 2);
    for b in buf {
        let _ = write!(s, "{b:02x}");
    }
    Ok(s)
}

/// SHA-256 of a token's secret part.
pub fn hash_secret(secret: &str) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, secret.as_bytes())
        .as_ref()
        .to_vec()
}

/// Splits `gft_<id>_<secret>`; `None` when the text is not shaped like a token.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.strip_prefix(PREFIX)?.split_once('_')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id) && hex(secret)).then_some((id, secret))
}

/// Whether `secret` is the one `record` was made with (constant time).
pub fn secret_matches(record: &AgentTokenRecord, secret: &str) -> bool {
    bool::from(hash_secret(secret).ct_eq(&record.secret_hash))
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Role {
    /// Write samples as one node (gRPC).
    Agent,
    /// Read the dashboard and the API.
    Viewer,
    /// Read, and change things (token management, recompute).
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Viewer => "viewer",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "agent" => Some(Role::Agent),
            "viewer" => Some(Role::Viewer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// Makes an agent token for `node` (not stored yet).
pub fn generate(node: &str, now_ms: UnixMs) -> Result<NewToken, TokenError> {
    generate_for(Role::Agent, node, now_ms)
}

/// Makes a token with `role` for `name` (a node for agents, a label otherwise).
pub fn generate_for(role: Role, node: &str, now_ms: UnixMs) -> Result<NewToken, TokenError> {
    let node = node.trim();
    if node.is_empty() || node.len() > 253 || node.chars().any(char::is_control) {
        return Err(TokenError::Invalid(format!(
            "node name {node:?} is not valid: 1 to 253 characters, no control characters"
        )));
    }
    let id = random_hex(8)?;
    let secret = random_hex(32)?;
    Ok(NewToken {
        token: format!("{PREFIX}{id}_{secret}"),
        record: AgentTokenRecord {
            id,
            node: node.to_owned(),
            role: role.as_str().to_owned(),
            secret_hash: hash_secret(&secret),
            created_ms: now_ms,
            revoked_ms: None,
        },
    })
}

/// `gpufleet-collector tokens …`.
#[derive(Debug, clap::Args)]
pub struct TokensArgs {
    /// Database URL (the one `serve` uses).
    #[arg(
        long,
        env = "GPUFLEET_DB",
        default_value = "sqlite://gpufleet.db",
        value_name = "URL",
        global = true
    )]
    pub db: String,
    #[command(subcommand)]
    pub command: TokensCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Make a token and print it (once: only its hash is stored).
    Add {
        /// Role agent: the node the token writes as; viewer/admin: whom it is for.
        node: String,
        /// agent (writes as NODE over gRPC), viewer (reads the dashboard and API) or
        /// admin (also changes things).
        #[arg(long, value_enum, default_value_t = Role::Agent)]
        role: Role,
    },
    /// List tokens: id, node, created, revoked (never the secrets).
    List,
    /// Revoke a token by id: agents using it are refused from their next connection.
    Revoke {
        /// The token's id (the part after `gft_`, as `list` shows it).
        id: String,
    },
}

/// Runs a `tokens` command on the store; returns what to print.
pub async fn run(args: TokensArgs) -> Result<String, TokenError> {
    let store = store::open(&args.db).await?;
    let result = run_on(store.as_ref(), args.command).await;
    store.close().await;
    result
}

/// Runs a `tokens` command on an open store.
pub async fn run_on(store: &dyn TokenStore, command: TokensCommand) -> Result<String, TokenError> {
    let now = gpufleet_core::config::now_ms();
    match command {
        TokensCommand::Add { node, role } => {
            let new = generate_for(role, &node, now)?;
            store.add_agent_token(&new.record).await?;
            let how = match role {
                Role::Agent => "give it to that node's agent with --token-file",
                Role::Viewer | Role::Admin => {
                    "log in at /login with it, or send it as `Authorization: Bearer …`"
                }
            };
            Ok(format!(
                "{}\n# {} token {} for {:?}: {how}; it is not shown again\n",
                new.token,
                role.as_str(),
                new.record.id,
                new.record.node
            ))
        }
        TokensCommand::List => {
            let mut out = String::from("ID\tROLE\tNODE\tCREATED\tREVOKED\n");
            for t in store.agent_tokens().await? {
                let revoked = t
                    .revoked_ms
                    .map(gpufleet_core::config::format_time)
                    .unwrap_or_else(|| "-".into());
                let _ = writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{revoked}",
                    t.id,
                    t.role,
                    t.node,
                    gpufleet_core::config::format_time(t.created_ms)
                );
            }
            Ok(out)
        }
        TokensCommand::Revoke { id } => {
            let id = id.trim().trim_start_matches(PREFIX);
            if store.revoke_agent_token(id, now).await? {
                Ok(format!("revoked token {id}\n"))
            } else {
                Err(TokenError::Invalid(format!(
                    "no valid token has id {id:?} (see `gpufleet-collector tokens list`)"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_and_match_only_their_secret() {
        let t = generate("node-a", 1).expect("token");
        let (id, secret) = parse(&t.token).expect("shaped like a token");
        assert_eq!(id, t.record.id);
        assert!(secret_matches(&t.record, secret));
        assert!(!secret_matches(&t.record, "00"));
        let other = generate("node-a", 1).expect("token");
        assert_ne!(other.token, t.token, "random");
        assert!(parse("gft_zz_11").is_none());
        assert!(parse("Bearer x").is_none());
        assert!(parse("gft_ab").is_none());
        assert!(!format!("{t:?}").contains(secret), "secret not in Debug");
        assert!(generate(" ", 1).is_err());
    }
}
