//! `grpc_uds`: the decision APIs on a Unix socket, for apps on the same
//! host (issue 20). One node, its TCP and Unix listeners sharing every
//! count; only the public APIs there (no admin, no peer); a stale socket
//! file from a killed process replaced, a live one or another file never.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::{ADMIN_TOKEN, config, inline, start, under};
use sluice::proto::v1 as pb;
use sluice::proto::v1::admin_client::AdminClient;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A fresh directory for this test's socket (removed with its files).
fn socket_path(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-uds-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("sluice.sock")
}

async fn unix_channel(path: &std::path::Path) -> Channel {
    Endpoint::from_shared(format!("unix:{}", path.display()))
        .unwrap()
        .connect()
        .await
        .expect("connects over the Unix socket")
}

async fn check(channel: &Channel, key: &str) -> pb::RateLimitResponse {
    RateLimiterClient::new(channel.clone())
        .check(pb::CheckRequest {
            requests: vec![inline("uds", key, 3, 60_000)],
        })
        .await
        .unwrap()
        .into_inner()
        .responses
        .remove(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_unix_socket_decides_on_the_same_counts_as_tcp() {
    let path = socket_path("same");
    let mut c = config();
    c.grpc_uds = Some(path.clone());
    let t = start(c).await;
    let uds = unix_channel(&path).await;
    // Open to apps running as other users: its directory is the guard.
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666, "{mode:o}");

    let health = HealthClient::new(uds.clone())
        .check(HealthCheckRequest {
            service: "sluice.v1.RateLimiter".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    // A limit of 3 spent over both listeners: one count.
    let mut seen = Vec::new();
    for via in [&uds, &t.channel, &uds, &t.channel] {
        seen.push(under(&check(via, "shared").await));
    }
    assert_eq!(seen, [true, true, true, false]);
    let last = check(&uds, "shared").await;
    assert_eq!(last.status, pb::Status::OverLimit as i32, "{last:?}");
    assert!(!last.approximate, "{last:?}");

    // The admin API is not there, even with its token.
    let mut admin = AdminClient::new(uds.clone());
    let mut reset = tonic::Request::new(pb::ResetKeyRequest {
        key: Some(pb::KeyRef {
            name: "uds".into(),
            unique_key: "shared".into(),
        }),
    });
    reset.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    let refused = admin.reset_key(reset).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused}");
    assert!(!under(&check(&t.channel, "shared").await), "not reset");

    // Stopped, the node removes its socket file.
    t.node.kill().await;
    assert!(!path.exists(), "{} removed at stop", path.display());
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_socket_is_replaced_a_live_one_or_a_file_never() {
    let path = socket_path("stale");
    // A killed process leaves its socket file behind: nothing listens.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let mut c = config();
    c.grpc_uds = Some(path.clone());
    let t = start(c.clone()).await;
    let uds = unix_channel(&path).await;
    assert!(under(&check(&uds, "stale").await));

    // A second node on the same path: refused, naming the field; the
    // first keeps serving there.
    let policies = sluice::policy::Policies::from_config(&c).unwrap();
    let clock = sluice::clock::FakeClock::new(common::BASE);
    // (Every other address of `config()` is an ephemeral port.)
    let other = c.clone();
    let err = sluice::server::Node::start(other.clone(), policies.clone(), None, clock.clone())
        .await
        .err()
        .expect("a live socket is not taken over");
    let err = err.to_string();
    assert!(
        err.starts_with("grpc_uds: ") && err.contains("another process is listening"),
        "{err}"
    );
    // The first still serves there — on a new connection (the refused
    // start must not have removed or replaced its socket).
    assert!(path.exists());
    assert!(
        under(&check(&unix_channel(&path).await, "stale").await),
        "the first still serves"
    );
    t.node.kill().await;

    // A path that is not a socket is never removed.
    std::fs::write(&path, b"an operator's file").unwrap();
    let err = sluice::server::Node::start(other, policies, None, clock)
        .await
        .err()
        .expect("a file is not a socket")
        .to_string();
    assert!(
        err.contains("grpc_uds: ") && err.contains("is not a socket"),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"an operator's file");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
