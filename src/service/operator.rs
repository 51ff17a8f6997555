//! Who is an operator: the admin token, and the check every admin call
//! meets.
//!
//! A reset refills a quota, so an app that could call `ResetKey` could
//! lift its own limit. The admin API therefore never answers a caller that
//! has not proved it is an operator, on any listener: it carries the admin
//! token (`authorization: Bearer …`), or a peer token signed with the
//! cluster secret (which operators of a cluster hold and apps do not).
//!
//! The token comes from `admin.token`, else from `admin.token_file`; when
//! that file does not exist a random one is generated and written there
//! (mode 0600) — so a node never runs with an admin API open to anyone,
//! and an operator on the host (or `kubectl exec … sluice admin`) reads it.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tonic::{Request, Status};

use crate::cluster::auth::{EXPIRED, Secret, TOKEN_HEADER};
use crate::config::{AdminConfig, MIN_ADMIN_TOKEN_BYTES};

/// Why the admin token could not be had.
#[derive(Debug, thiserror::Error)]
#[error("admin.token_file: {path}: {why}")]
pub struct TokenError {
    path: String,
    why: String,
}

/// The admin token, kept as its digest: compared in constant time, never
/// logged.
#[derive(Clone)]
pub struct AdminToken(Arc<[u8; 32]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(…)")
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl AdminToken {
    /// The token `admin` names: the literal, the file's, or a new one
    /// written to the file.
    pub fn load(admin: &AdminConfig) -> Result<AdminToken, TokenError> {
        if let Some(token) = &admin.token {
            return Ok(AdminToken::of(token.trim().as_bytes()));
        }
        let path = &admin.token_file;
        let error = |why: String| TokenError {
            path: path.display().to_string(),
            why,
        };
        let token = match std::fs::read(path) {
            Ok(bytes) => {
                check_private(path).map_err(error)?;
                bytes
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                generate(path).map_err(|e| error(format!("cannot write a new token: {e}")))?
            }
            Err(e) => return Err(error(format!("cannot read: {e}"))),
        };
        let token = token.trim_ascii();
        if token.len() < MIN_ADMIN_TOKEN_BYTES {
            return Err(error(format!(
                "the token is shorter than {MIN_ADMIN_TOKEN_BYTES} bytes"
            )));
        }
        Ok(AdminToken::of(token))
    }

    pub fn of(token: &[u8]) -> AdminToken {
        AdminToken(Arc::new(digest(token)))
    }

    /// Whether `presented` is the token (constant time over the digests).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let theirs = digest(presented);
        self.0
            .iter()
            .zip(theirs.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

/// Write a fresh random token to `path` unless another process got there
/// first (two nodes started from one directory): written to a private
/// temporary file, then linked into place, which fails if `path` exists —
/// so the file is never seen half-written and the winner's token is the
/// one both use.
fn generate(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut random = [0u8; 48];
    getrandom::getrandom(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let token = hex(&random[..32]);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // A random name, not the pid: in a container the pid is always 1, and
    // a file left by a node killed mid-write must not block the next start.
    let tmp = path.with_extension(format!("tmp-{}", hex(&random[32..])));
    let mut file = private_file(&tmp)?;
    let linked = file
        .write_all(format!("{token}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::hard_link(&tmp, path));
    // Ours to remove: created by this call.
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "generated the admin token");
            Ok(token.into_bytes())
        }
        // Another node linked its token first: that one is the token.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::read(path),
        Err(e) => Err(e),
    }
}

/// A token file others could read or have written is no credential: on
/// Unix it must belong to this process's user and be private to it.
#[cfg(unix)]
fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!(
            "owned by uid {}, not this process's uid {me}: refused",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:o} lets others read or write it: chmod 600",
            meta.mode() & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(unix)]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// The check in front of the admin API, wherever it is served.
#[derive(Clone)]
pub struct OperatorAuth {
    token: AdminToken,
    secret: Secret,
    /// This node's id: a peer token bound to another node is refused.
    node_id: Arc<str>,
}

impl OperatorAuth {
    pub fn new(token: AdminToken, secret: Secret, node_id: &str) -> OperatorAuth {
        OperatorAuth {
            token,
            secret,
            node_id: Arc::from(node_id),
        }
    }
}

impl tonic::service::Interceptor for OperatorAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let metadata = request.metadata();
        // Either credential will do (a CLI may send both: the token file
        // beside it and the cluster secret it was given).
        let bearer = metadata
            .get("authorization")
            .map(|v| v.as_bytes().strip_prefix(b"Bearer ").unwrap_or_default());
        if bearer.is_some_and(|b| self.token.matches(b.trim_ascii())) {
            return Ok(request);
        }
        if let Some(token) = metadata.get(TOKEN_HEADER)
            && self.secret.is_set()
        {
            return match self
                .secret
                .check_peer_token(token.to_str().ok(), &self.node_id)
            {
                Ok(_) => Ok(request),
                Err(EXPIRED) => Err(Status::unauthenticated(format!(
                    "admin call refused: {EXPIRED} (this node's clock and the caller's differ by more than cluster.token_window: correct NTP on both, or send the admin token instead)"
                ))),
                Err(why) => Err(Status::unauthenticated(format!(
                    "admin call refused: {why}"
                ))),
            };
        }
        Err(Status::unauthenticated(if bearer.is_some() {
            "admin call refused: wrong admin token"
        } else {
            "admin call refused: no operator credential (send `authorization: Bearer <token>` with the token from admin.token_file, as `sluice admin` does, or sign it with the cluster secret)"
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-op-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_missing_token_file_is_written_once_and_then_read() {
        let d = dir("gen");
        let cfg = AdminConfig {
            token_file: d.join("sub").join("admin.token"),
            ..AdminConfig::default()
        };
        let first = AdminToken::load(&cfg).unwrap();
        let written = std::fs::read_to_string(&cfg.token_file).unwrap();
        assert_eq!(written.trim().len(), 64, "32 random bytes, hex");
        assert!(first.matches(written.trim().as_bytes()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&cfg.token_file)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "only the owner reads it");
        }
        // A restart reads the same token; no temporary file is left.
        let second = AdminToken::load(&cfg).unwrap();
        assert!(second.matches(written.trim().as_bytes()));
        let names: Vec<_> = std::fs::read_dir(d.join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // Another node's generation does not overwrite it.
        assert_eq!(
            generate(&cfg.token_file).unwrap(),
            written.as_bytes(),
            "the existing token wins"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    fn write_private(path: &Path, text: &str) {
        let mut f = private_file(path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn a_token_file_left_half_made_does_not_block_a_start() {
        let d = dir("stale");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("admin.token");
        // A node killed between writing its temporary file and linking it.
        write_private(&path.with_extension("tmp-1"), "half");
        let token = AdminToken::load(&AdminConfig {
            token_file: path.clone(),
            ..AdminConfig::default()
        })
        .expect("a stale temporary file is no obstacle");
        assert!(token.matches(std::fs::read_to_string(&path).unwrap().trim().as_bytes()));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("open");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("admin.token");
        write_private(&path, "0123456789abcdef0123\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AdminToken::load(&AdminConfig {
            token_file: path.clone(),
            ..AdminConfig::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("admin.token_file: "), "{err}");
        assert!(err.contains("mode 644"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(
            AdminToken::load(&AdminConfig {
                token_file: path,
                ..AdminConfig::default()
            })
            .is_ok()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_short_or_unreadable_token_is_refused_naming_the_field() {
        let d = dir("short");
        std::fs::create_dir_all(&d).unwrap();
        let cfg = AdminConfig {
            token_file: d.join("admin.token"),
            ..AdminConfig::default()
        };
        write_private(&cfg.token_file, "short\n");
        let err = AdminToken::load(&cfg).unwrap_err().to_string();
        assert!(err.starts_with("admin.token_file: "), "{err}");
        assert!(err.contains("shorter than 16"), "{err}");
        let cfg = AdminConfig {
            token_file: d.clone(),
            ..AdminConfig::default()
        };
        let err = AdminToken::load(&cfg).unwrap_err().to_string();
        assert!(err.contains("cannot read"), "{err}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_the_token_or_a_secret_signature_passes() {
        use tonic::service::Interceptor;
        let secret = Secret::new(Some(b"cluster"));
        let mut auth = OperatorAuth::new(AdminToken::of(b"0123456789abcdef0"), secret.clone(), "n");
        let call = |header: Option<(&'static str, String)>| {
            let mut r = Request::new(());
            if let Some((k, v)) = header {
                r.metadata_mut().insert(k, v.parse().unwrap());
            }
            r
        };
        let code = |r: Result<Request<()>, Status>| r.err().map(|s| s.code());
        assert_eq!(
            code(auth.call(call(None))),
            Some(tonic::Code::Unauthenticated)
        );
        let bearer = |t: &str| Some(("authorization", format!("Bearer {t}")));
        assert_eq!(code(auth.call(call(bearer("0123456789abcdef0")))), None);
        assert_eq!(
            code(auth.call(call(bearer("0123456789abcdef1")))),
            Some(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            code(auth.call(call(Some(("authorization", "0123456789abcdef0".into()))))),
            Some(tonic::Code::Unauthenticated),
            "not a bearer credential"
        );
        let signed = secret.peer_token("op").unwrap();
        assert_eq!(code(auth.call(call(Some((TOKEN_HEADER, signed))))), None);
        let forged = Secret::new(Some(b"guess")).peer_token("op").unwrap();
        assert_eq!(
            code(auth.call(call(Some((TOKEN_HEADER, forged))))),
            Some(tonic::Code::Unauthenticated)
        );
        // With no cluster secret, a peer token proves nothing.
        let mut alone =
            OperatorAuth::new(AdminToken::of(b"0123456789abcdef0"), Secret::new(None), "n");
        assert_eq!(
            code(alone.call(call(Some((TOKEN_HEADER, "x:1:1:1:00".into()))))),
            Some(tonic::Code::Unauthenticated)
        );
    }
}
