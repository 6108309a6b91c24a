//! Who an agent is: decided from its credential, never from the node name it sends.
//!
//! Checked once per stream, at Hello time ([`crate::ingest`]), before anything is stored:
//! - **Client certificate** (mTLS): the certificate rustls already verified against
//!   `--client-ca` must name the Hello's node among its DNS names; otherwise the stream
//!   is refused with `PERMISSION_DENIED`.

use rustls_pki_types::{CertificateDer, ServerName};
use tonic::Status;

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
