//! Who an agent is: decided from its credential, never from the node name it sends.
//!
//! Checked once per stream, at Hello time ([`crate::ingest::stream`]), before anything is stored:
//! - **Client certificate** (mTLS): the certificate rustls already verified against
//!   `--client-ca` must name the Hello's node among its DNS names.
//! - **Token** (`authorization: Bearer gft_…`): must exist, not be revoked, and belong to
//!   the Hello's node ([`crate::auth::tokens`]).
//!
//! A credential for another node → `PERMISSION_DENIED`; an unknown, malformed or revoked
//! token, or none where one is required → `UNAUTHENTICATED`. Messages never echo a token.

use crate::auth::tokens;
use crate::store::TokenStore;
use rustls_pki_types::{CertificateDer, ServerName};
use tonic::Status;
use tonic::metadata::MetadataMap;
use tracing::{error, warn};

/// Whether agents must present a credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentAuth {
    /// Required unless the gRPC listener is on a loopback address (resolved at start).
    #[default]
    Auto,
    /// Every agent needs a token or a client certificate.
    Required,
    /// Agents without a credential are accepted (`--allow-unauthenticated-agents`); a
    /// credential that is presented is still checked.
    Optional,
}

impl AgentAuth {
    /// `Auto` decided for a listener on `loopback` or not.
    pub fn resolve(self, loopback: bool) -> AgentAuth {
        match self {
            AgentAuth::Auto if loopback => AgentAuth::Optional,
            AgentAuth::Auto => AgentAuth::Required,
            other => other,
        }
    }
}

/// Checks the stream's credentials against the Hello's `node`.
pub async fn authorize(
    store: &dyn TokenStore,
    auth: AgentAuth,
    metadata: &MetadataMap,
    certs: Option<&[CertificateDer<'static>]>,
    node: &str,
) -> Result<(), Status> {
    let has_cert = certs.is_some_and(|c| !c.is_empty());
    check_certificate(certs, node)?;
    let has_token = check_token(store, metadata, node).await?;
    if auth != AgentAuth::Optional && !has_cert && !has_token {
        return Err(Status::unauthenticated(
            "this collector requires agent credentials: give the agent a token \
             (`gpufleet-collector tokens add NODE`, then --token-file) or a client \
             certificate (mTLS)",
        ));
    }
    Ok(())
}

/// Checks the bearer token, if any. Returns whether one was presented (and is valid).
async fn check_token(
    store: &dyn TokenStore,
    metadata: &MetadataMap,
    node: &str,
) -> Result<bool, Status> {
    let Some(value) = metadata.get("authorization") else {
        return Ok(false);
    };
    let malformed = || {
        Status::unauthenticated(
            "malformed authorization: expected `Bearer gft_<id>_<secret>` (a token from \
             `gpufleet-collector tokens add`)",
        )
    };
    let text = value.to_str().map_err(|_| malformed())?;
    let token = text.strip_prefix("Bearer ").ok_or_else(malformed)?.trim();
    let (id, secret) = tokens::parse(token).ok_or_else(malformed)?;
    let record = store.agent_token(id).await.map_err(|e| {
        error!(error = %e, "cannot look up an agent token");
        Status::unavailable("the collector cannot check credentials now; retry later")
    })?;
    let unknown =
        || Status::unauthenticated("unknown agent token: check --token-file, or make a new token");
    let Some(record) = record else {
        warn!(node = %node, token_id = %id, "agent refused: unknown token");
        return Err(unknown());
    };
    if !tokens::secret_matches(&record, secret) {
        warn!(node = %node, token_id = %id, "agent refused: wrong token secret");
        return Err(unknown());
    }
    if record.role != "agent" {
        warn!(node = %node, token_id = %id, role = %record.role, "agent refused: not an agent token");
        return Err(Status::permission_denied(format!(
            "token {id} is a {} token; agents need an agent token (`tokens add NODE`)",
            record.role
        )));
    }
    if record.revoked_ms.is_some() {
        warn!(node = %node, token_id = %id, "agent refused: revoked token");
        return Err(Status::unauthenticated(format!(
            "agent token {id} was revoked; make a new one with `gpufleet-collector tokens add`"
        )));
    }
    if record.node != node {
        warn!(node = %node, token_id = %id, token_node = %record.node, "agent refused: token of another node");
        return Err(Status::permission_denied(format!(
            "this token belongs to node {:?}; it cannot write as {node:?}",
            record.node
        )));
    }
    Ok(true)
}

/// Checks that the client certificate chain `certs` (leaf first), when there is one, may
/// write as `node`.
pub fn check_certificate(
    certs: Option<&[CertificateDer<'static>]>,
    node: &str,
) -> Result<(), Status> {
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Ok(());
    };
    let cert = webpki::EndEntityCert::try_from(leaf)
        .map_err(|_| Status::unauthenticated("the client certificate cannot be parsed"))?;
    let denied = || {
        Status::permission_denied(format!(
            "this client certificate is not valid for node {node:?}: a node may only write as \
             the name in its certificate"
        ))
    };
    let name = ServerName::try_from(node).map_err(|_| denied())?;
    cert.verify_is_valid_for_subject_name(&name)
        .map_err(|_| denied())
}
