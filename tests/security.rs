//! Who may call what: peer mTLS, the shared secret's tokens and their
//! replay window, admin credentials, TLS on the public API (reloaded when
//! its files change), and the connection bound.

mod common;

use std::time::Duration;

use common::pki::{Ca, Leaf, temp_dir};
use common::{BASE, config, eventually, inline, under};
use sluice::clock::FakeClock;
use sluice::config::Config;
use sluice::policy::Policies;
use sluice::proto::peer as peer_pb;
use sluice::proto::peer::peer_client::PeerClient;
use sluice::proto::v1 as pb;
use sluice::proto::v1::admin_client::AdminClient;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::server::Node;
use sluice::tls::PeerTls;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

async fn start(config: Config) -> Node {
    let policies = Policies::from_config(&config).expect("valid policies");
    Node::start(config, policies, None, FakeClock::new(BASE))
        .await
        .expect("node starts")
}

fn client_tls(ca: &Ca, leaf: Option<&Leaf>, name: &str) -> ClientTlsConfig {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca.ca_file).unwrap()))
        .domain_name(name);
    if let Some(l) = leaf {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&l.cert_file).unwrap(),
            std::fs::read(&l.key_file).unwrap(),
        ));
    }
    tls
}

/// A channel over TLS, connected now (so a refused handshake is an error here).
async fn tls_channel(addr: std::net::SocketAddr, tls: ClientTlsConfig) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

async fn plain_channel(addr: std::net::SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn forward_request(
    secret: Option<&sluice::cluster::auth::Secret>,
) -> tonic::Request<peer_pb::ForwardRequest> {
    let mut req = tonic::Request::new(peer_pb::ForwardRequest {
        protocol_version: sluice::proto::PEER_PROTOCOL_VERSION,
        from_node: "intruder".into(),
        items: vec![],
        ..Default::default()
    });
    if let Some(token) = secret.and_then(|s| s.peer_token("intruder")) {
        req.metadata_mut()
            .insert("x-sluice-peer", token.parse().unwrap());
    }
    req
}

/// A signed peer call over TLS: `Err` when the handshake or the call is refused.
async fn peer_call(
    addr: std::net::SocketAddr,
    tls: ClientTlsConfig,
    secret: &sluice::cluster::auth::Secret,
) -> Result<(), String> {
    let channel = tls_channel(addr, tls).await?;
    PeerClient::new(channel)
        .forward(forward_request(Some(secret)))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn peer_tls(ca: &Ca, leaf: &Leaf) -> PeerTls {
    PeerTls {
        ca_file: ca.ca_file.clone(),
        cert_file: leaf.cert_file.clone(),
        key_file: leaf.key_file.clone(),
        server_name: "sluice-peer".into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn peers_need_a_certificate_from_the_cluster_ca() {
    let dir = temp_dir("peer-mtls");
    let cluster_ca = Ca::new(&dir, "cluster");
    let app_ca = Ca::new(&dir, "app");
    let mut nodes = Vec::new();
    for i in 0..2 {
        let leaf = cluster_ca.leaf(&format!("node-{i}"), &["sluice-peer"]);
        let mut c = config();
        c.node_id = format!("node-{i}");
        c.cluster.secret = Some("s3cret".into());
        c.cluster.peer_addr = Some("127.0.0.1:0".parse().unwrap());
        c.cluster.tls = Some(peer_tls(&cluster_ca, &leaf));
        if let Some(first) = nodes.first() {
            let first: &Node = first;
            c.cluster.seeds = vec![first.gossip_addr.to_string()];
        }
        nodes.push(start(c).await);
    }
    eventually(
        "both rings hold both nodes",
        Duration::from_secs(20),
        || async { nodes.iter().all(|n| n.limiter.ring().members().len() == 2) },
    )
    .await;

    // Forwarding works over mTLS: node-0 answers for a key node-1 owns.
    let ring = nodes[0].limiter.ring();
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            ring.owner(&sluice::store::key::encode("m", k))
                .is_some_and(|o| &*o.node_id == "node-1")
        })
        .unwrap();
    let mut app = RateLimiterClient::new(plain_channel(nodes[0].grpc_addr).await);
    let r = app
        .check(pb::CheckRequest {
            requests: vec![inline("m", &key, 5, 60_000)],
        })
        .await
        .unwrap()
        .into_inner()
        .responses
        .remove(0);
    assert!(under(&r), "{r:?}");
    assert_eq!(r.owner, "node-1", "decided by the owner, over mTLS");

    let peer_addr = nodes[1].peer_addr.expect("a peer listener");
    let secret = sluice::cluster::auth::Secret::new(Some(b"s3cret"));
    // No client certificate: the handshake fails, no call is read.
    let no_cert = peer_call(
        peer_addr,
        client_tls(&cluster_ca, None, "sluice-peer"),
        &secret,
    )
    .await;
    assert!(no_cert.is_err(), "no client certificate: refused");
    // An app's certificate (another CA): refused the same way.
    let app_leaf = app_ca.leaf("app", &["app"]);
    let app_cert = peer_call(
        peer_addr,
        client_tls(&cluster_ca, Some(&app_leaf), "sluice-peer"),
        &secret,
    )
    .await;
    assert!(app_cert.is_err(), "an app's certificate: refused");
    // The public listener does not serve the peer or admin APIs at all.
    let public = plain_channel(nodes[1].grpc_addr).await;
    let err = PeerClient::new(public.clone())
        .forward(forward_request(Some(&secret)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    let err = AdminClient::new(public)
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");

    // An operator with a cluster certificate: still needs the secret's token.
    let operator = cluster_ca.leaf("operator", &["operator"]);
    let ch = tls_channel(
        peer_addr,
        client_tls(&cluster_ca, Some(&operator), "sluice-peer"),
    )
    .await
    .expect("a cluster certificate is accepted");
    let err = AdminClient::new(ch.clone())
        .cluster_status(pb::ClusterStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let mut signed = tonic::Request::new(pb::ClusterStatusRequest {});
    signed.metadata_mut().insert(
        "x-sluice-peer",
        secret.peer_token("operator").unwrap().parse().unwrap(),
    );
    let status = AdminClient::new(ch)
        .cluster_status(signed)
        .await
        .expect("certificate + token")
        .into_inner();
    assert_eq!(status.members.len(), 2);
    for n in nodes {
        n.kill().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replayed_peer_call_is_refused() {
    let mut c = config();
    c.cluster.secret = Some("s3cret".into());
    let node = start(c).await;
    let mut peer = PeerClient::new(plain_channel(node.grpc_addr).await);
    let secret = sluice::cluster::auth::Secret::new(Some(b"s3cret"));
    let token = secret.peer_token("node-x").unwrap();
    let call = |token: Option<&str>| {
        let mut req = forward_request(None);
        if let Some(t) = token {
            req.metadata_mut()
                .insert("x-sluice-peer", t.parse().unwrap());
        }
        req
    };
    peer.forward(call(Some(&token)))
        .await
        .expect("the first use of a token is accepted");
    let err = peer.forward(call(Some(&token))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("replayed"), "{err:?}");
    let err = peer.forward(call(None)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let wrong = sluice::cluster::auth::Secret::new(Some(b"guess"));
    let err = peer
        .forward(call(wrong.peer_token("node-x").as_deref()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    // Admin calls need the token too (apps have no secret).
    let mut admin = AdminClient::new(plain_channel(node.grpc_addr).await);
    let err = admin
        .reset_key(pb::ResetKeyRequest {
            key: Some(pb::KeyRef {
                name: "a".into(),
                unique_key: "b".into(),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    node.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn public_tls_is_served_and_follows_its_files() {
    let dir = temp_dir("api-tls");
    let first = Ca::new(&dir.join("first"), "first");
    let second = Ca::new(&dir.join("second"), "second");
    let served = first.leaf("server", &["localhost"]);
    let mut c = config();
    c.tls = Some(sluice::tls::ApiTls {
        cert_file: served.cert_file.clone(),
        key_file: served.key_file.clone(),
        client_ca_file: None,
    });
    let node = start(c).await;
    let addr = node.grpc_addr;
    // Plain HTTP/2 to a TLS port gets nowhere.
    let plain = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .connect_lazy();
    assert!(
        RateLimiterClient::new(plain)
            .check(pb::CheckRequest { requests: vec![] })
            .await
            .is_err()
    );
    let ch = tls_channel(addr, client_tls(&first, None, "localhost"))
        .await
        .expect("TLS with the first CA");
    let r = RateLimiterClient::new(ch)
        .check(pb::CheckRequest {
            requests: vec![inline("t", "k", 5, 60_000)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(under(&r.responses[0]));

    // Rotate: a certificate from another CA, written over the same files.
    let rotated = second.leaf("server", &["localhost"]);
    std::fs::copy(&rotated.key_file, &served.key_file).unwrap();
    std::fs::copy(&rotated.cert_file, &served.cert_file).unwrap();
    eventually(
        "new connections see the rotated certificate",
        Duration::from_secs(10),
        || async {
            tls_channel(addr, client_tls(&second, None, "localhost"))
                .await
                .is_ok()
        },
    )
    .await;
    assert!(
        tls_channel(addr, client_tls(&first, None, "localhost"))
            .await
            .is_err(),
        "the old CA no longer verifies the served certificate"
    );
    // A broken file is refused; the last good certificate stays.
    std::fs::write(&served.cert_file, "not a certificate").unwrap();
    let reloads = || {
        common::metric_sum(
            &node.limiter.metrics().render(),
            "sluice_config_reloads_total{result=\"error\"}",
        )
    };
    eventually(
        "the broken file is noticed",
        Duration::from_secs(10),
        || async { reloads() >= 1.0 },
    )
    .await;
    assert!(
        tls_channel(addr, client_tls(&second, None, "localhost"))
            .await
            .is_ok()
    );
    node.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn public_tls_can_require_client_certificates() {
    let dir = temp_dir("api-mtls");
    let ca = Ca::new(&dir, "api");
    let apps = Ca::new(&dir, "apps");
    let server = ca.leaf("server", &["localhost"]);
    let mut c = config();
    c.tls = Some(sluice::tls::ApiTls {
        cert_file: server.cert_file.clone(),
        key_file: server.key_file.clone(),
        client_ca_file: Some(apps.ca_file.clone()),
    });
    let node = start(c).await;
    let call = |ch: Channel| async move {
        RateLimiterClient::new(ch)
            .check(pb::CheckRequest {
                requests: vec![inline("t", "k", 5, 60_000)],
            })
            .await
    };
    let anonymous = tls_channel(node.grpc_addr, client_tls(&ca, None, "localhost")).await;
    assert!(
        match anonymous {
            Err(_) => true,
            Ok(ch) => call(ch).await.is_err(),
        },
        "no client certificate: refused"
    );
    let app = apps.leaf("app", &["app"]);
    let ch = tls_channel(node.grpc_addr, client_tls(&ca, Some(&app), "localhost"))
        .await
        .expect("an app certificate is accepted");
    assert!(under(&call(ch).await.unwrap().into_inner().responses[0]));
    node.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_beyond_the_bound_are_closed_and_counted() {
    let mut c = config();
    c.limits.max_connections = 2;
    let node = start(c).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let ch = plain_channel(node.grpc_addr).await;
        RateLimiterClient::new(ch.clone())
            .check(pb::CheckRequest { requests: vec![] })
            .await
            .expect("within the bound");
        held.push(ch);
    }
    let third = Endpoint::from_shared(format!("http://{}", node.grpc_addr))
        .unwrap()
        .timeout(Duration::from_secs(2))
        .connect_lazy();
    // Closed before HTTP/2: a transport error (Unavailable, Unknown or
    // Cancelled, depending on when the client notices).
    let third = RateLimiterClient::new(third)
        .check(pb::CheckRequest { requests: vec![] })
        .await;
    assert!(third.is_err(), "{third:?}");
    let resources = &node.limiter.metrics().resources;
    // The one connection the third channel opened, and only it.
    assert_eq!(resources.exhausted_count("connections"), 1);
    let text = node.limiter.metrics().render();
    assert!(
        text.contains("sluice_connections{listener=\"grpc\"} 2"),
        "{text}"
    );
    // Closing one frees its slot.
    held.pop();
    eventually("a slot frees up", Duration::from_secs(10), || async {
        let ch = Endpoint::from_shared(format!("http://{}", node.grpc_addr))
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect_lazy();
        RateLimiterClient::new(ch)
            .check(pb::CheckRequest { requests: vec![] })
            .await
            .is_ok()
    })
    .await;
    drop(held);
    node.kill().await;
}
