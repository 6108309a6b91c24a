//! A development certificate authority (rcgen): a CA, a server certificate for the
//! collector and one client certificate per node, so mTLS can be set up in minutes
//! (`gpufleet-collector certs`). For production, use your own PKI; the collector only
//! needs PEM files.
//!
//! A node's client certificate carries the node name as its DNS name (and common name):
//! under mTLS the collector lets it write as that node only ([`crate::ingest::identity`]).

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use time::OffsetDateTime;

/// The common name of the development CA; also how an existing CA is found again.
const CA_NAME: &str = "gpufleet development CA";

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("key", &"***")
            .finish_non_exhaustive()
    }
}

/// A certificate authority that signs server and client certificates.
pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (PEM) and key.
    pub pem: Pem,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From one hour ago (clock skew) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - time::Duration::hours(1),
            not_after: now + time::Duration::days(i64::from(days)),
        }
    }
}

fn ca_params(validity: Validity) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    params
}

impl DevCa {
    /// A new CA with a fresh ECDSA P-256 key.
    pub fn new(validity: Validity) -> Result<DevCa, CertsError> {
        let key = KeyPair::generate()?;
        let params = ca_params(validity);
        let cert = params.self_signed(&key)?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        Ok(DevCa {
            issuer: Issuer::new(params, key),
            pem,
        })
    }

    /// The CA written earlier by [`DevCa::new`] (its certificate and key PEM), to sign
    /// more certificates with it.
    pub fn load(cert_pem: String, key_pem: String) -> Result<DevCa, CertsError> {
        let key = KeyPair::from_pem(&key_pem)?;
        // The issuer needs the CA's name and key; both are what `new` used.
        let params = ca_params(Validity::days(1));
        Ok(DevCa {
            issuer: Issuer::new(params, key),
            pem: Pem {
                cert: cert_pem,
                key: key_pem,
            },
        })
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[String], validity: Validity) -> Result<Pem, CertsError> {
        if names.is_empty() {
            return Err(CertsError::Invalid(
                "a server certificate needs at least one name (--server-name)".into(),
            ));
        }
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, validity)
    }

    /// A client certificate for node `node`: its DNS name and common name are the node.
    pub fn client(&self, node: &str, validity: Validity) -> Result<Pem, CertsError> {
        self.leaf(
            &[node.to_owned()],
            ExtendedKeyUsagePurpose::ClientAuth,
            validity,
        )
    }

    fn leaf(
        &self,
        names: &[String],
        usage: ExtendedKeyUsagePurpose,
        validity: Validity,
    ) -> Result<Pem, CertsError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, names[0].as_str());
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The options of `gpufleet-collector certs`.
#[derive(Debug, Clone, clap::Args)]
pub struct CertsArgs {
    /// Folder for the PEM files (created if missing). An existing `ca.pem`/`ca.key` there
    /// is reused, so nodes can be added later.
    #[arg(long, default_value = "gpufleet-certs", value_name = "DIR")]
    pub out: PathBuf,
    /// A name (DNS name or IP address) agents use to reach the collector; repeat for
    /// several. Makes `server.pem`/`server.key`.
    #[arg(long = "server-name", value_name = "NAME")]
    pub server_names: Vec<String>,
    /// A node to make a client certificate for (`NODE.pem`/`NODE.key`); repeat.
    #[arg(long = "node", value_name = "NODE")]
    pub nodes: Vec<String>,
    /// Validity of the new certificates, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
}

impl From<CertsArgs> for CertsPlan {
    fn from(a: CertsArgs) -> CertsPlan {
        CertsPlan {
            out: a.out,
            server_names: a.server_names,
            nodes: a.nodes,
            days: a.days,
        }
    }
}

/// What `gpufleet-collector certs` makes.
#[derive(Debug, Clone)]
pub struct CertsPlan {
    /// Folder the files go to (created if missing).
    pub out: PathBuf,
    /// Names of the collector's server certificate (omit for client certificates only).
    pub server_names: Vec<String>,
    /// One client certificate per node.
    pub nodes: Vec<String>,
    /// Validity of new certificates, in days.
    pub days: u32,
}

/// Writes `ca.pem`/`ca.key` (or reuses them when present), `server.pem`/`server.key`
/// and `<node>.pem`/`<node>.key`. Keys are written with mode 0600. Returns the files
/// written.
pub fn write_plan(plan: &CertsPlan) -> Result<Vec<PathBuf>, CertsError> {
    for node in &plan.nodes {
        if node.is_empty()
            || !node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(CertsError::Invalid(format!(
                "node name {node:?} cannot be a certificate DNS name (letters, digits, '-' and '.' only)"
            )));
        }
    }
    std::fs::create_dir_all(&plan.out).map_err(|source| CertsError::Write {
        path: plan.out.clone(),
        source,
    })?;
    let validity = Validity::days(plan.days);
    let ca_cert = plan.out.join("ca.pem");
    let ca_key = plan.out.join("ca.key");
    let mut written = Vec::new();
    let ca = if ca_cert.exists() && ca_key.exists() {
        DevCa::load(read(&ca_cert)?, read(&ca_key)?)?
    } else {
        let ca = DevCa::new(validity)?;
        write(&ca_cert, &ca.pem.cert, false)?;
        write(&ca_key, &ca.pem.key, true)?;
        written.extend([ca_cert, ca_key]);
        ca
    };
    let mut out = |name: &str, pem: Pem| -> Result<(), CertsError> {
        let cert = plan.out.join(format!("{name}.pem"));
        let key = plan.out.join(format!("{name}.key"));
        write(&cert, &pem.cert, false)?;
        write(&key, &pem.key, true)?;
        written.extend([cert, key]);
        Ok(())
    };
    if !plan.server_names.is_empty() {
        out("server", ca.server(&plan.server_names, validity)?)?;
    }
    for node in &plan.nodes {
        out(node, ca.client(node, validity)?)?;
    }
    Ok(written)
}

fn read(path: &Path) -> Result<String, CertsError> {
    std::fs::read_to_string(path).map_err(|source| CertsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Writes `text` to `path`; private files get mode 0600 from the start.
fn write(path: &Path, text: &str, private: bool) -> Result<(), CertsError> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let err = |source| CertsError::Write {
        path: path.to_owned(),
        source,
    };
    let mut file = options.open(path).map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_ca_signs_certificates_that_chain_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = CertsPlan {
            out: dir.path().to_owned(),
            server_names: vec!["localhost".into(), "127.0.0.1".into()],
            nodes: vec!["node-a".into()],
            days: 30,
        };
        write_plan(&plan).expect("first run");
        let ca_before = read(&dir.path().join("ca.pem")).expect("ca");
        let later = CertsPlan {
            server_names: vec![],
            nodes: vec!["node-b".into()],
            ..plan
        };
        let written = write_plan(&later).expect("second run reuses the CA");
        assert_eq!(read(&dir.path().join("ca.pem")).expect("ca"), ca_before);
        assert_eq!(written.len(), 2, "only node-b's pair: {written:?}");
        // node-b's certificate verifies against the original CA.
        let ca = rustls_pki_types::CertificateDer::from(
            rustls_pki_types::pem::PemObject::from_pem_slice(ca_before.as_bytes())
                .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
                .expect("ca der"),
        );
        let node_b: rustls_pki_types::CertificateDer<'static> =
            rustls_pki_types::pem::PemObject::from_pem_file(dir.path().join("node-b.pem"))
                .expect("node-b der");
        let anchor = webpki::anchor_from_trusted_cert(&ca).expect("anchor");
        let cert = webpki::EndEntityCert::try_from(&node_b).expect("parse");
        cert.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            &[],
            rustls_pki_types::UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .expect("node-b chains to the reused CA");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join("node-b.key"))
                .expect("key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "keys are private");
        }
    }

    #[test]
    fn node_names_that_are_not_dns_names_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = CertsPlan {
            out: dir.path().to_owned(),
            server_names: vec![],
            nodes: vec!["../evil".into()],
            days: 1,
        };
        let err = write_plan(&plan).expect_err("refused");
        assert!(err.to_string().contains("DNS name"), "{err}");
        assert!(!dir.path().join("ca.pem").exists(), "nothing written");
    }
}
