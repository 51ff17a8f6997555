//! TLS: optional for the public API, mutual for the peer API.
//!
//! Both are configured by file paths (PEM) and served by our own acceptor
//! rather than tonic's `ServerTlsConfig`, for two reasons: the files are
//! re-read when they change (a rotated certificate is served without a
//! restart; a broken one is refused and the previous one kept), and the
//! accept loop bounds connections per listener ([`crate::server::conn`]).
//!
//! The peer listener requires a client certificate signed by the cluster CA:
//! a connection without one never completes its handshake, so no peer call
//! is read from it. Peers verify each other's server certificates against
//! the same CA under one shared name (`server_name`), since they dial pod
//! IPs that no certificate would list.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// How often certificate files are checked for changes.
pub const RELOAD_POLL: Duration = Duration::from_secs(1);

/// `[tls]`: TLS for the public gRPC API (and the Envoy front).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiTls {
    /// The server's certificate chain (PEM); reloaded when it changes.
    pub cert_file: PathBuf,
    /// The certificate's private key (PEM); reloaded with it.
    pub key_file: PathBuf,
    /// When set, callers must present a certificate signed by this CA.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// `[cluster.tls]`: mutual TLS between peers (needs `cluster.peer_addr`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerTls {
    /// The cluster CA: signs every node's certificate (and operators').
    pub ca_file: PathBuf,
    /// This node's certificate: used as the server's and as the client's.
    pub cert_file: PathBuf,
    /// The certificate's private key (PEM).
    pub key_file: PathBuf,
    /// The name every node's certificate carries (a DNS SAN), which peers
    /// check instead of an address. Default: `sluice-peer`.
    #[serde(default = "default_server_name")]
    pub server_name: String,
}

fn default_server_name() -> String {
    "sluice-peer".into()
}

/// A certificate or key file that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TlsError {
    pub field: String,
    pub reason: String,
}

fn error(field: &str, reason: impl std::fmt::Display) -> TlsError {
    TlsError {
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

fn read(field: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| error(field, format!("cannot read {}: {e}", path.display())))
}

fn certs(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(field, format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(error(
            field,
            format!("{}: no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

fn key(field: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(field, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        error(
            field,
            format!("{}: no usable private key: {e}", path.display()),
        )
    })
}

fn roots(field: &str, path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for cert in certs(field, path)? {
        store
            .add(cert)
            .map_err(|e| error(field, format!("{}: {e}", path.display())))?;
    }
    Ok(Arc::new(store))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a listener serves: its files and whether clients must authenticate.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerFiles {
    /// Config key prefix for errors (`tls` or `cluster.tls`).
    pub section: &'static str,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Clients must present a certificate signed by this CA.
    pub client_ca_file: Option<PathBuf>,
}

impl ServerFiles {
    pub fn api(tls: &ApiTls) -> ServerFiles {
        ServerFiles {
            section: "tls",
            cert_file: tls.cert_file.clone(),
            key_file: tls.key_file.clone(),
            client_ca_file: tls.client_ca_file.clone(),
        }
    }

    pub fn peer(tls: &PeerTls) -> ServerFiles {
        ServerFiles {
            section: "cluster.tls",
            cert_file: tls.cert_file.clone(),
            key_file: tls.key_file.clone(),
            client_ca_file: Some(tls.ca_file.clone()),
        }
    }

    fn field(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    /// Read the files and build a server config (HTTP/2 only, as gRPC is).
    pub fn load(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let chain = certs(&self.field("cert_file"), &self.cert_file)?;
        let key = key(&self.field("key_file"), &self.key_file)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| error(self.section, e))?;
        let builder = match &self.client_ca_file {
            Some(ca) => {
                let field = self.field(if self.section == "tls" {
                    "client_ca_file"
                } else {
                    "ca_file"
                });
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots(&field, ca)?,
                    provider(),
                )
                .build()
                .map_err(|e| error(&field, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| error(&self.field("key_file"), e))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    fn paths(&self) -> Vec<&Path> {
        let mut p = vec![self.cert_file.as_path(), self.key_file.as_path()];
        p.extend(self.client_ca_file.as_deref());
        p
    }
}

/// A server config that follows its files.
pub struct Reloading {
    files: ServerFiles,
    current: ArcSwap<rustls::ServerConfig>,
}

/// A file's identity for change detection: modification time and length
/// (read through symlinks, so a Kubernetes Secret's swap counts).
type Stamp = Vec<Option<(SystemTime, u64)>>;

impl Reloading {
    pub fn new(files: ServerFiles) -> Result<Arc<Reloading>, TlsError> {
        let config = files.load()?;
        Ok(Arc::new(Reloading {
            files,
            current: ArcSwap::new(config),
        }))
    }

    /// The config for the next handshake.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current.load_full()
    }

    fn stamp(&self) -> Stamp {
        self.files
            .paths()
            .iter()
            .map(|p| {
                let m = std::fs::metadata(p).ok()?;
                Some((m.modified().ok()?, m.len()))
            })
            .collect()
    }

    /// Re-read the files whenever they change, until cancelled. A change
    /// that does not load is logged and counted; the previous config stays.
    pub async fn watch(self: Arc<Self>, on_reload: impl Fn(bool), token: CancellationToken) {
        let mut last = self.stamp();
        let mut tick = tokio::time::interval(RELOAD_POLL);
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.stamp();
            if now == last {
                continue;
            }
            last = now;
            match self.files.load() {
                Ok(config) => {
                    self.current.store(config);
                    tracing::info!(section = self.files.section, "TLS certificate reloaded");
                    on_reload(true);
                }
                Err(e) => {
                    tracing::error!(error = %e, "TLS files changed but do not load; keeping the previous ones");
                    on_reload(false);
                }
            }
        }
    }
}

/// The client side of peer mTLS, for tonic's channels.
pub fn peer_client(tls: &PeerTls) -> Result<tonic::transport::ClientTlsConfig, TlsError> {
    let ca = read("cluster.tls.ca_file", &tls.ca_file)?;
    let cert = read("cluster.tls.cert_file", &tls.cert_file)?;
    let key = read("cluster.tls.key_file", &tls.key_file)?;
    Ok(tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .domain_name(tls.server_name.clone()))
}
