//! Who may reset a limit: apps reach the public port, and nothing there
//! lets them reset, inspect or list keys, or speak the peer API (which
//! can reset and spend any key). The admin listener answers only the
//! admin token's holder; the token is generated when none is configured,
//! and `sluice admin` finds it.

mod common;

use common::{ADMIN_TOKEN, config, inline, start, under};
use sluice::config::Sources;
use sluice::proto::peer as peer_pb;
use sluice::proto::peer::peer_client::PeerClient;
use sluice::proto::v1 as pb;
use sluice::proto::v1::admin_client::AdminClient;
use tonic::Code;
use tonic::transport::Channel;

fn key(name: &str, k: &str) -> Option<pb::KeyRef> {
    Some(pb::KeyRef {
        name: name.into(),
        unique_key: k.into(),
    })
}

async fn plain(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Every admin and peer call a plain client (no credential) can make on
/// `addr`, with the code each got.
async fn every_privileged_call(addr: std::net::SocketAddr) -> Vec<(&'static str, Code)> {
    let ch = plain(addr).await;
    let mut admin = AdminClient::new(ch.clone());
    let mut peer = PeerClient::new(ch);
    let code = |r: Result<(), tonic::Status>| r.err().map_or(Code::Ok, |s| s.code());
    vec![
        (
            "ResetKey",
            code(
                admin
                    .reset_key(pb::ResetKeyRequest {
                        key: key("api", "tenant"),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "InspectKey",
            code(
                admin
                    .inspect_key(pb::InspectKeyRequest {
                        key: key("api", "tenant"),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "TopKeys",
            code(
                admin
                    .top_keys(pb::TopKeysRequest {
                        by: pb::TopBy::Hits as i32,
                        count: 10,
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "ClusterStatus",
            code(
                admin
                    .cluster_status(pb::ClusterStatusRequest {})
                    .await
                    .map(drop),
            ),
        ),
        (
            "Forward",
            code(
                peer.forward(peer_pb::ForwardRequest::default())
                    .await
                    .map(drop),
            ),
        ),
        (
            "Report",
            code(
                peer.report(peer_pb::ReportRequest::default())
                    .await
                    .map(drop),
            ),
        ),
        (
            "Sync",
            code(peer.sync(peer_pb::SyncRequest::default()).await.map(drop)),
        ),
        (
            "Pull",
            code(peer.pull(peer_pb::PullRequest::default()).await.map(drop)),
        ),
        (
            "Transfer",
            code(
                peer.transfer(peer_pb::TransferRequest::default())
                    .await
                    .map(drop),
            ),
        ),
        (
            "Reset",
            code(peer.reset(peer_pb::ResetRequest::default()).await.map(drop)),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_public_port_of_a_node_without_a_secret_serves_no_admin_or_peer_call() {
    // The single-node default: no cluster secret, no peer listener.
    let n = start(config()).await;
    for _ in 0..3 {
        n.check(inline("api", "tenant", 3, 60_000)).await;
    }
    assert!(!under(&n.check(inline("api", "tenant", 3, 60_000)).await));
    for (call, code) in every_privileged_call(n.node.grpc_addr).await {
        assert_eq!(code, Code::Unimplemented, "{call} on the public port");
    }
    // The attempted reset changed nothing: the tenant is still refused.
    let r = n.check(inline("api", "tenant", 3, 60_000)).await;
    assert!(!under(&r), "still exhausted: {r:?}");
    assert_eq!(r.remaining, 0);

    // The admin listener: nothing without the token, or with another one.
    for (call, code) in every_privileged_call(n.node.admin_addr).await {
        let expected = if ["ResetKey", "InspectKey", "TopKeys", "ClusterStatus"].contains(&call) {
            Code::Unauthenticated
        } else {
            Code::Unimplemented
        };
        assert_eq!(code, expected, "{call} on the admin port without a token");
    }
    let mut wrong = tonic::Request::new(pb::ResetKeyRequest {
        key: key("api", "tenant"),
    });
    wrong.metadata_mut().insert(
        "authorization",
        "Bearer test-admin-token-9876543210".parse().unwrap(),
    );
    let err = AdminClient::new(plain(n.node.admin_addr).await)
        .reset_key(wrong)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("wrong admin token"), "{err:?}");
    let r = n.check(inline("api", "tenant", 3, 60_000)).await;
    assert!(!under(&r), "a wrong token resets nothing: {r:?}");

    // The operator, with the token, resets it.
    let reset = n
        .admin()
        .await
        .reset_key(pb::ResetKeyRequest {
            key: key("api", "tenant"),
        })
        .await
        .expect("the token is accepted")
        .into_inner();
    assert!(reset.existed);
    let r = n.check(inline("api", "tenant", 3, 60_000)).await;
    assert!(under(&r));
    assert_eq!(r.remaining, 2);
    n.node.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_secret_the_public_port_refuses_every_unsigned_privileged_call() {
    let mut c = config();
    c.cluster.secret = Some("s3cret".into());
    let n = start(c).await;
    for _ in 0..3 {
        n.check(inline("api", "tenant", 3, 60_000)).await;
    }
    for (call, code) in every_privileged_call(n.node.grpc_addr).await {
        assert_eq!(code, Code::Unauthenticated, "{call} without a token");
    }
    let r = n.check(inline("api", "tenant", 3, 60_000)).await;
    assert!(!under(&r), "still exhausted: {r:?}");
    assert_eq!(r.remaining, 0);
    n.node.kill().await;
}

#[test]
fn a_cluster_without_a_secret_is_refused_naming_the_field() {
    let err = Sources::from_toml_str("[cluster]\nseeds = [\"10.0.0.1:7946\"]\n").unwrap_err();
    assert!(err.0.starts_with("cluster.secret: required"), "{err}");
    Sources::from_toml_str("[cluster]\nseeds = [\"10.0.0.1:7946\"]\nsecret = \"s\"\n")
        .expect("with a secret it loads");
    let err = Sources::from_toml_str("[admin]\ntoken = \"short\"\n").unwrap_err();
    assert!(err.0.starts_with("admin.token: at least 16"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_generated_token_is_what_sluice_admin_uses() {
    let dir = common::pki::temp_dir("admin-token");
    let file = dir.join("run").join("admin.token");
    let mut c = config();
    c.admin.token = None;
    c.admin.token_file = file.clone();
    let n = start(c).await;
    let token = std::fs::read_to_string(&file).expect("the node wrote its token");
    assert_eq!(token.trim().len(), 64);
    assert_ne!(token.trim(), ADMIN_TOKEN);
    for _ in 0..4 {
        n.check(inline("api", "cli", 3, 60_000)).await;
    }
    let sluice = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("admin")
            .args(args)
            // Away from any token file a node left in the working directory.
            .current_dir(&dir)
            .env_remove("SLUICE_ADMIN__TOKEN")
            .env_remove("SLUICE_CLUSTER__SECRET")
            .output()
            .expect("sluice runs")
    };
    let addr = n.node.admin_addr.to_string();
    let file_arg = file.display().to_string();
    let out = sluice(&[
        "--addr",
        &addr,
        "--token-file",
        &file_arg,
        "inspect",
        "--name",
        "api",
        "--key",
        "cli",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("remaining 0  hits 4  refusals 1"),
        "{stdout}"
    );
    // Without the token file: refused, saying what is missing.
    let out = sluice(&["--addr", &addr, "inspect", "--name", "api", "--key", "cli"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no operator credential"), "{stderr}");
    n.node.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
