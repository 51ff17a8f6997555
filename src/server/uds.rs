//! The Unix-socket listener (`grpc_uds`): the node-local path for apps on
//! the same host. A socket file outlives a process that was killed, so
//! binding first clears a *stale* one — a socket nothing answers on — and
//! refuses a live one (another node serving there) or a path that is not
//! a socket at all (never delete an operator's file). The file is removed
//! when the node stops. It is open to every user (mode 0666): who may
//! connect is decided by who reaches its directory.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::config::ConfigError;

/// The socket file at `path`, removed when the node stops.
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Bind `path`, clearing a stale socket there; every failure names
/// `grpc_uds`.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), ConfigError> {
    let fail = |what: String| ConfigError(format!("grpc_uds: {}: {what}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(fail("another process is listening there".into()));
            }
            std::fs::remove_file(path)
                .map_err(|e| fail(format!("a stale socket that cannot be removed: {e}")))?;
        }
        Ok(_) => return Err(fail("exists and is not a socket".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e.to_string())),
    }
    let listener = UnixListener::bind(path).map_err(|e| fail(e.to_string()))?;
    let file = SocketFile(path.to_path_buf());
    // Connecting takes write permission on the socket, and apps run as
    // other users: anyone who reaches the directory may connect — the
    // directory (a hostPath mounted into the pods that may) is the guard,
    // as the TCP port is open to anyone who reaches it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| fail(format!("cannot open it to other users: {e}")))?;
    Ok((listener, file))
}
