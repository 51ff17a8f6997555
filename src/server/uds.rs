//! The Unix-socket listener (`grpc_uds`): the node-local path for apps on
//! the same host. A socket file outlives a process that was killed, so
//! binding first clears a *stale* one — a socket that refuses connections:
//! nothing listens there — and refuses a live one (another node serving
//! there), one it cannot tell (any other error), or a path that is not a
//! socket at all (never delete an operator's file). The file is removed
//! when the node stops, if it is still the one this node bound.
//!
//! It is open to every user (mode 0666): who may connect is decided by who
//! reaches its directory.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use crate::config::ConfigError;

/// How long a connect to an existing socket may take to tell live from
/// stale (a live one with a full backlog may not answer at once).
const PROBE: Duration = Duration::from_secs(1);

/// The socket file this node bound, removed when the node stops — unless
/// the path now holds another file (another process replaced it).
pub struct SocketFile {
    path: PathBuf,
    /// The bound file's device and inode.
    id: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Bind `path`, clearing a stale socket there; every failure names
/// `grpc_uds`.
pub async fn bind(path: &Path) -> Result<(UnixListener, SocketFile), ConfigError> {
    let fail = |what: String| ConfigError(format!("grpc_uds: {}: {what}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            match tokio::time::timeout(PROBE, UnixStream::connect(path)).await {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)
                        .map_err(|e| fail(format!("a stale socket that cannot be removed: {e}")))?;
                }
                Ok(Ok(_)) | Err(_) => {
                    return Err(fail("another process is listening there".into()));
                }
                Ok(Err(e)) => {
                    return Err(fail(format!(
                        "an existing socket this node cannot probe: {e}"
                    )));
                }
            }
        }
        Ok(_) => return Err(fail("exists and is not a socket".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let listener = UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| fail(e.to_string()))?;
    let file = SocketFile {
        path: path.to_path_buf(),
        id: (meta.dev(), meta.ino()),
    };
    // Connecting takes write permission on the socket, and apps run as
    // other users: anyone who reaches the directory may connect — the
    // directory is the guard, as the TCP port is open to anyone who
    // reaches it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| fail(format!("cannot open it to other users: {e}")))?;
    Ok((listener, file))
}
