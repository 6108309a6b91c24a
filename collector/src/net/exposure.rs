//! Exposure warnings: a listener on a non-loopback address without TLS, or agents or
//! viewers allowed in without credentials there. Logged at start and listed in
//! `GET /api/v1/health` as `"warnings"` (for the dashboard to show), so an operator can
//! see them without reading the log. They name addresses and flags, never secrets.

use std::net::SocketAddr;

/// What [`warnings`] looks at.
#[derive(Debug, Clone, Copy)]
pub struct Exposure {
    pub grpc: SocketAddr,
    pub grpc_tls: bool,
    pub http: SocketAddr,
    pub http_tls: bool,
    /// Agents may connect without a token or client certificate.
    pub agents_unauthenticated: bool,
    /// Viewers may use the dashboard and API without logging in.
    pub viewers_anonymous: bool,
}

/// The warnings for one exposure, handed to the HTTP handlers as an extension.
#[derive(Debug, Clone, Default)]
pub struct ExposureWarnings(pub std::sync::Arc<Vec<String>>);

/// The warnings that apply; empty when everything non-loopback is encrypted and
/// authenticated.
pub fn warnings(e: &Exposure) -> Vec<String> {
    let mut out = Vec::new();
    let exposed = |addr: &SocketAddr| !addr.ip().is_loopback();
    if exposed(&e.grpc) && !e.grpc_tls {
        out.push(format!(
            "gRPC ingest listens on {} (not loopback) without TLS: anyone on the path can read \
             and alter agents' traffic; see SECURITY.md",
            e.grpc
        ));
    }
    if exposed(&e.http) && !e.http_tls {
        out.push(format!(
            "the HTTP API listens on {} (not loopback) without TLS: anyone on the path can read \
             and alter its traffic, logins included; see SECURITY.md",
            e.http
        ));
    }
    if exposed(&e.grpc) && e.agents_unauthenticated {
        out.push(format!(
            "agents may connect to {} without credentials (--allow-unauthenticated-agents): any \
             host that reaches this port can write as any node",
            e.grpc
        ));
    }
    if exposed(&e.http) && e.viewers_anonymous {
        out.push(format!(
            "the dashboard and API on {} are open to anyone who reaches this port \
             (--allow-anonymous-viewers)",
            e.http
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposure(ip: [u8; 4], tls: bool, open: bool) -> Exposure {
        let addr = SocketAddr::from((ip, 1));
        Exposure {
            grpc: addr,
            grpc_tls: tls,
            http: addr,
            http_tls: tls,
            agents_unauthenticated: open,
            viewers_anonymous: open,
        }
    }

    #[test]
    fn loopback_or_locked_down_listeners_have_no_warnings() {
        assert!(warnings(&exposure([127, 0, 0, 1], false, true)).is_empty());
        assert!(warnings(&exposure([10, 0, 0, 1], true, false)).is_empty());
    }

    #[test]
    fn each_exposure_is_named() {
        let w = warnings(&exposure([10, 0, 0, 1], false, true));
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("gRPC") && w[0].contains("without TLS"));
        assert!(w[1].contains("HTTP") && w[1].contains("without TLS"));
        assert!(w[2].contains("--allow-unauthenticated-agents"));
        assert!(w[3].contains("--allow-anonymous-viewers"));
    }
}
